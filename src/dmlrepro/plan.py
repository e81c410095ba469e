"""`dmlrepro plan`: what a workflow target will cost before the first GPU-hour (docs/workflow.md#plan).

For a workflow config and a selection (targets: papers or experiments, as `snakemake TARGET` takes them;
datasets: config `only_datasets`), the training jobs the workflow would submit, the GPU-hours they
request (one allocation each: runtime x GPUs of dmlrepro.job_requests.train_request, as rules train and
search ask), the hours a preflight projected (``--preflight``: its JSON, docs/preflight.md), the runs over
budget, and the datasets needed with their preparation status (dmlrepro.selection.dataset_status).
A search's final-stage runs are counted at the search space's example point, as the preflight counts them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dmlrepro.job_requests import search_run_count, train_request
from dmlrepro.nested import deep_merge
from dmlrepro.run_table import RunTable
from dmlrepro.runs import ExperimentError, validate_workflow_config
from dmlrepro.selection import PAPERS, assume_preparable, dataset_status, paper_of, select, target_scopes

DEFAULT_CONFIG = "config/config.yaml"
SHOWN = 5  # over-budget runs listed on the screen (all of them: --json)


def job_rows(config: Mapping[str, Any], table: RunTable, experiments: Sequence[str]) -> list[dict[str, Any]]:
    """One row per training job of `experiments` (a run shared by experiments: once, under the first):
    its experiment, paper, dataset, the runs it trains and its requested runtime (min) and GPUs."""
    rows, seen = [], set()
    for name in experiments:
        searches = table.experiment_searches(name)
        jobs = [(run, None) for run in table.experiment_runs(name) + list(table.example_final_runs(name).values())]
        jobs += [(run, table.search_spec(run.run_id)) for run in searches]
        for run, search in jobs:
            if run.run_id in seen:
                continue
            seen.add(run.run_id)
            request = train_request(config, run.dataset, search)
            rows.append(
                {
                    "run_id": run.run_id,
                    "experiment": name,
                    "paper": paper_of(name) or "-",
                    "dataset": run.dataset,
                    "runs": search_run_count(search),
                    "runtime_min": request["runtime"],
                    "gpus": request["gpu"],
                }
            )
    return rows


def totals(rows: Sequence[Mapping[str, Any]], key: str, projected: Mapping[str, float] | None = None) -> list[dict]:
    """Jobs, runs and requested GPU-hours per value of `key` (paper, experiment, dataset); `projected`:
    hours per value where the preflight gives them."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = out.setdefault(row[key], {key: row[key], "jobs": 0, "runs": 0, "gpu_hours": 0.0})
        entry["jobs"] += 1
        entry["runs"] += row["runs"]
        entry["gpu_hours"] += row["runtime_min"] * row["gpus"] / 60
    for name, entry in out.items():
        entry["projected_hours"] = None if projected is None else projected.get(name)
    return list(out.values())


def preflight_hours(preflight: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    """The preflight's projected hours per experiment and per paper (a run shared by experiments counts
    in each, as the preflight sums them), per dataset (each of `rows`' runs once; none from a preflight
    that records no `run_hours`), and its over-budget runs among `rows`."""
    experiments = {e["name"]: e["hours"] for e in preflight.get("experiments", [])}
    papers: dict[str, float] = {}
    for name, hours in experiments.items():
        papers[paper_of(name) or "-"] = papers.get(paper_of(name) or "-", 0.0) + hours
    run_hours = preflight.get("run_hours", {})
    datasets: dict[str, float] = {}
    for row in {row["run_id"]: row for row in rows}.values():
        if row["run_id"] in run_hours:
            datasets[row["dataset"]] = datasets.get(row["dataset"], 0.0) + run_hours[row["run_id"]]
    over = set(preflight.get("over_budget", []))
    return {
        "experiment": experiments,
        "paper": papers,
        "dataset": datasets,
        "over_budget": [row for row in rows if row["run_id"] in over],
    }


def make_plan(
    config: dict[str, Any], targets: Sequence[str] = (), preflight: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The plan of `targets` (default: every active experiment) as a JSON-ready document: every job the
    targets ask for on the selected datasets, each dataset's status here, and what builds now (the jobs
    whose dataset is prepared or can be)."""
    validate_workflow_config(config)
    wanted = select(config, assume_preparable)  # every selected dataset, prepared or not
    scopes = target_scopes(wanted.active)
    unknown = [t for t in targets if t not in scopes]
    if unknown:
        papers = ", ".join(p for p in PAPERS if p in scopes)
        raise ExperimentError(f"unknown target {unknown[0]!r}; expected a paper ({papers}) or an active experiment")
    scope = [e for e in wanted.active if not targets or any(e in scopes[t] for t in targets)]
    rows = job_rows(config, RunTable(wanted.config, wanted.experiments), [e for e in scope if e in wanted.experiments])
    projected = preflight_hours(preflight, rows) if preflight is not None else None
    statuses = {
        d: dataset_status(d, config["data_root"], config["sources"].get(d))
        for d in config["datasets"]
        if any(r["dataset"] == d for r in rows)
    }
    now = [row for row in rows if statuses[row["dataset"]].usable]
    return {
        "targets": list(targets) or ["all"],
        "only_datasets": config.get("only_datasets"),
        "experiments": [e for e in scope if e in wanted.experiments],
        "jobs": rows,
        "papers": totals(rows, "paper", projected and projected["paper"]),
        "by_experiment": totals(rows, "experiment", projected and projected["experiment"]),
        "by_dataset": totals(rows, "dataset", projected and projected["dataset"]),
        "gpu_hours": gpu_hours(rows),
        "now": {"jobs": len(now), "gpu_hours": gpu_hours(now)},
        "projected_hours": None if preflight is None else preflight.get("total_hours"),
        "over_budget": None if projected is None else projected["over_budget"],
        "datasets": [{"dataset": d, "status": status.status, "fetch": status.fetch} for d, status in statuses.items()],
        "not_run": select(config).not_run(scope),  # left out here and now, and why
    }


def gpu_hours(rows: Sequence[Mapping[str, Any]]) -> float:
    return sum(row["runtime_min"] * row["gpus"] / 60 for row in rows)


# -- the screen ------------------------------------------------------------------------------------
def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _table(entries: Sequence[Mapping[str, Any]], key: str, projected: bool) -> list[str]:
    rows = [(key, "jobs", "runs", "GPU-h requested") + (("h projected",) if projected else ())]
    rows += [
        (e[key], str(e["jobs"]), str(e["runs"]), _hours(e["gpu_hours"]))
        + ((_hours(e["projected_hours"]),) if projected else ())
        for e in entries
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in rows
    ]


def format_plan(plan: Mapping[str, Any], configfile: str, by_experiment: bool = False) -> str:
    """The plan on one screen (the per-experiment table with `by_experiment`, else per dataset)."""
    only, projected = plan["only_datasets"], plan["projected_hours"] is not None
    jobs = plan["jobs"]
    lines = [
        f"plan of {' '.join(plan['targets'])} --configfile {configfile}"
        + (f" (only_datasets: {', '.join(only)})" if only else ""),
        f"{len(jobs)} training jobs, {sum(r['runs'] for r in jobs)} runs, {plan['gpu_hours']:,.0f} GPU-hours "
        "requested (one allocation per job; a retry asks again)"
        + (f"; {plan['projected_hours']:,.0f} h projected by the preflight" if projected else ""),
        "",
        *_table(plan["papers"], "paper", projected),
        "",
        *(
            _table(plan["by_experiment"], "experiment", projected)
            if by_experiment
            else _table(plan["by_dataset"], "dataset", projected)
        ),
    ]
    if plan["over_budget"] is not None:
        over = plan["over_budget"]
        lines += ["", f"over budget (preflight): {len(over)} run(s)"]
        lines += [f"  {r['run_id']} ({r['experiment']}, {r['dataset']})" for r in over[:SHOWN]]
        if len(over) > SHOWN:
            lines.append(f"  ... and {len(over) - SHOWN} more (--json: over_budget)")
    lines += ["", "datasets:"]
    for d in plan["datasets"]:
        lines.append(f"  {d['dataset']:14s} {d['status']}")
        if d["fetch"]:
            lines.append(f"    {d['fetch']}")
    if plan["now"]["jobs"] < len(jobs):
        lines += [
            "",
            f"buildable now: {plan['now']['jobs']} jobs, {plan['now']['gpu_hours']:,.0f} GPU-hours; "
            f"{len(plan['not_run'])} experiment(s) not run or built in part (--json: not_run)",
        ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dmlrepro plan",
        description="The training jobs, requested GPU-hours, projected hours (given a preflight) and the "
        "datasets needed of a workflow target, before submitting it (docs/workflow.md#plan).",
    )
    p.add_argument(
        "targets", nargs="*", metavar="TARGET", help="a paper (pfml, rsw, asap) or an experiment (default: all)"
    )
    p.add_argument(
        "--configfile",
        nargs="+",
        default=[DEFAULT_CONFIG],
        metavar="FILE",
        help=f"workflow config (default: {DEFAULT_CONFIG}); several: merged in order, as snakemake merges them",
    )
    p.add_argument(
        "--only-datasets", nargs="+", metavar="NAME", help="as snakemake --config 'only_datasets=[NAME,...]'"
    )
    p.add_argument("--opt-in", nargs="+", metavar="NAME", help="as snakemake --config 'opt_in=[NAME,...]'")
    p.add_argument("--preflight", metavar="FILE", help="a preflight's JSON (dmlrepro preflight --json FILE)")
    p.add_argument("--experiments", action="store_true", help="a table per experiment instead of per dataset")
    p.add_argument("--json", action="store_true", help="print the whole plan as JSON")
    return p


def merged_configs(paths: Sequence[str]) -> dict[str, Any]:
    """The workflow config of `paths`, each merged over the ones before (mappings key by key, anything
    else replaced), as `snakemake --configfile A B` merges them: e.g. config/rehearsal.yaml over config/paper.yaml."""
    config: dict[str, Any] = {}
    for path in paths:
        config = deep_merge(config, yaml.safe_load(Path(path).read_text()) or {})
    return config


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = merged_configs(args.configfile)
        if args.only_datasets:
            config["only_datasets"] = args.only_datasets
        if args.opt_in:
            config["opt_in"] = args.opt_in
        preflight = json.loads(Path(args.preflight).read_text()) if args.preflight else None
        plan = make_plan(config, args.targets, preflight)
    except (OSError, yaml.YAMLError, json.JSONDecodeError, ExperimentError, ValueError, KeyError) as error:
        print(f"dmlrepro plan: {' '.join(args.configfile)}: {error}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=1) if args.json else format_plan(plan, " ".join(args.configfile), args.experiments))
    return 0


if __name__ == "__main__":
    sys.exit(main())
