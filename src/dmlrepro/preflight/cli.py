"""`dmlrepro preflight`: every run shape of a workflow config built and stepped on this node, and
the projected cost of the whole reproduction (docs/preflight.md).

    dmlrepro preflight --configfile config/paper.yaml --json preflight.json
    dmlrepro preflight --configfile config/paper.yaml --device cpu --steps 1 --batch-size 4

Exit status 0: every shape stepped and every run fits its time budget; 1: a shape failed or a run
is over budget (the reasons are printed); 2: the config or the options are unusable.
"""

from __future__ import annotations

import argparse
import functools
import json
import queue
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from dmlrepro.data import load
from dmlrepro.data.prepared import is_prepared
from dmlrepro.data.registry import EMBEDDED
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK
from dmlrepro.nested import deep_merge
from dmlrepro.run_table import ResultsLayout
from dmlrepro.train.config import resolve_run_config

from .node import node_facts
from .projection import (
    RunCost,
    Speed,
    budget_hours,
    measure_kcenter,
    measure_knn,
    profile_retries,
    run_hours,
    summarize,
)
from .shapes import Shape, group_runs, train_classes
from .sources import data_source, missing_weights, stand_in_counts, weights_warning
from .stepping import Measurement, preflight_config
from .worker import ShapeWorker, available_memory_bytes

DEFAULT_CONFIG = "config/config.yaml"
DEFAULT_PROFILE = "slurm"
DEFAULT_SHAPE_TIMEOUT = 900  # seconds: a GPU shape takes seconds, a large one on a CPU minutes
SHOWN_PROBLEMS = 25  # problems listed in the table (the JSON has every over-budget run)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dmlrepro preflight",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--configfile", default=DEFAULT_CONFIG, help=f"workflow config (default: {DEFAULT_CONFIG})")
    p.add_argument("--experiments", nargs="+", metavar="NAME", help="only these experiments (default: the active ones)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where to step (default: auto)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per shape (default: 3)")
    p.add_argument(
        "--batch-size",
        type=int,
        help="step every shape at this batch instead of its own (a quick CPU check; hours are then scaled per image)",
    )
    p.add_argument("--json", metavar="FILE", help="write the result as JSON")
    p.add_argument("--table", metavar="FILE", help="also write the printed table to FILE")
    p.add_argument("--retries", type=int, help="SLURM retries per job (default: the profile's `retries`)")
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"Snakemake profile whose `retries` to use (default: {DEFAULT_PROFILE}/)",
    )
    p.add_argument("--data-root", help="where prepared datasets are (default: the config's data_root)")
    p.add_argument(
        "--shape-timeout",
        type=float,
        default=DEFAULT_SHAPE_TIMEOUT,
        metavar="SECONDS",
        help=f"a shape not measured within this time fails (default: {DEFAULT_SHAPE_TIMEOUT})",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="measure N shapes at a time, each in its own process (a quick check on a CPU node with N "
        "cores; the shapes then share the node, so their times and hours are upper bounds; default: 1)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.workers < 1 or (args.batch_size is not None and args.batch_size < 1):
        print("dmlrepro preflight: --steps, --workers and --batch-size must be at least 1", file=sys.stderr)
        return 2
    try:
        config = yaml.safe_load(Path(args.configfile).read_text())
        shapes, unresolved, members = group_runs(config, args.experiments)
    except (OSError, yaml.YAMLError, ValueError, KeyError) as error:
        print(f"dmlrepro preflight: {args.configfile}: {error}", file=sys.stderr)
        return 2
    retries = args.retries if args.retries is not None else profile_retries(args.profile)
    return preflight(
        config,
        args.configfile,
        shapes=(shapes, unresolved, members),
        device=_device(args.device),
        steps=args.steps,
        batch_size=args.batch_size,
        retries=retries,
        data_root=args.data_root or config.get("data_root", "data"),
        json_path=args.json,
        table_path=args.table,
        shape_timeout=args.shape_timeout,
        workers=args.workers,
    )


def preflight(
    config: dict[str, Any],
    label: str,
    *,
    shapes=None,
    device: str = "auto",
    steps: int = 3,
    batch_size: int | None = None,
    retries: int | None = None,
    data_root: str | None = None,
    json_path: str | None = None,
    table_path: str | None = None,
    shape_timeout: float = DEFAULT_SHAPE_TIMEOUT,
    workers: int = 1,
) -> int:
    """Measure and project ``config`` (``label`` names it in the table), print the table, write
    the JSON and the table where asked; the exit status (0 ok, 1 problems)."""
    shapes, unresolved, members = shapes or group_runs(config)
    with tempfile.TemporaryDirectory(prefix="dmlrepro-preflight-") as scratch:
        result = run_preflight(
            config,
            shapes,
            unresolved,
            members,
            device=_device(device),
            steps=steps,
            batch_size=batch_size,
            retries=retries or 0,
            data_root=data_root or config.get("data_root", "data"),
            scratch=Path(scratch),
            shape_timeout=shape_timeout,
            workers=workers,
        )
    text = format_table(result, label, retries)
    print(text, flush=True)
    for path, content in ((table_path, text + "\n"), (json_path, json.dumps(result["json"], indent=2) + "\n")):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
    return 1 if result["problems"] else 0


def _device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("dmlrepro preflight: --device cuda: torch sees no CUDA GPU")
    return name


def run_preflight(
    config: dict[str, Any],
    shapes: list[Shape],
    unresolved,
    members: dict[str, list[str]],
    *,
    device: str,
    steps: int,
    batch_size: int | None,
    retries: int,
    data_root: str,
    scratch: Path,
    shape_timeout: float = DEFAULT_SHAPE_TIMEOUT,
    workers: int = 1,
) -> dict[str, Any]:
    """Measure every shape (``workers`` at a time), project every run; returns the JSON document,
    the table's rows and the problems (failed shapes, over-budget runs)."""
    warned: set[str] = set()
    rows, costs, problems, notes = [], [], [], {}
    results = config.get("results", "results")
    # the run configs (and stand-in images) one after the other, then the measurements in parallel
    prepared = [_prepare(shape, device, batch_size, data_root, scratch, warned, results) for shape in shapes]
    measured = _measure_all(prepared, steps, device, workers, shape_timeout)
    for shape, measurement, (_, _, note) in zip(shapes, measured, prepared):
        if note:
            notes.setdefault(note, []).append(shape.name)
        if shape.finals:
            notes.setdefault(
                "final-stage runs projected at their search space's example point (their ids are "
                "stand-ins: the best point is known only after the search)",
                [],
            ).append(shape.name)
        rows.append((shape, measurement))
        if measurement.status != "ok":
            problems.append(f"shape {shape.name} failed: {measurement.error}")
            continue
        costs.extend(_project(config, shape, measurement, data_root, scratch, retries, device))
    for bad in unresolved:
        problems.append(f"experiment {bad.name} does not resolve: {bad.error}")
    over = [cost for cost in costs if cost.over_budget]
    problems += [
        f"run {cost.run_id} ({', '.join(cost.experiments)}): {cost.hours:,.2f} h projected, budget "
        f"{cost.budget_hours:,.2f} h (time limit × (retries {retries} + 1))"
        for cost in over
    ]
    experiments, total = summarize(costs, members)
    doc = {
        "device": node_facts(torch.device(device)),
        "configs": [_config_entry(shape, m) for shape, m in rows] + [_unresolved_entry(bad) for bad in unresolved],
        "experiments": experiments,
        "total_hours": total,
        "run_hours": {cost.run_id: cost.hours for cost in costs},  # per run: dmlrepro plan's hours per dataset
        "over_budget": [cost.run_id for cost in over],
    }
    return {"json": doc, "rows": rows, "costs": costs, "problems": problems, "notes": notes}


def _prepare(
    shape: Shape, device: str, batch_size: int | None, data_root: str, scratch: Path, warned: set[str], results: str
) -> tuple[dict[str, Any] | Measurement, str | None, str | None]:
    """(the run config to measure, or the failure; the weights file missing, if any; the data note). A run
    that fine-tunes from the digit trunk looks for it where the workflow builds it under ``results``."""
    try:
        cfg = DIGIT_TRUNK.with_folder(shape.config, ResultsLayout(results, data_root).trunk_dir())
        source = data_source(cfg["dataset"], data_root, scratch)
        weights = missing_weights(cfg["model"])
        if weights and weights not in warned:
            warned.add(weights)
            tqdm.write(weights_warning(weights, cfg["model"].get("weights_cache_dir")), file=sys.stderr)
        run_cfg = preflight_config(
            cfg, device=device, source=source, batch_size=batch_size, random_init=weights is not None
        )
    except (ValueError, KeyError, OSError) as error:
        return Measurement(status="failed", error=f"{type(error).__name__}: {error}"), None, None
    return run_cfg, weights, source.note


def _measure_all(
    prepared: list[tuple], steps: int, device: str, workers: int, shape_timeout: float
) -> list[Measurement]:
    """Each prepared shape's measurement, in order, on ``workers`` shape processes at once; on a CPU
    node they share at most 80 % of the memory available now."""
    available = available_memory_bytes() if device == "cpu" else None
    pool: queue.SimpleQueue[ShapeWorker] = queue.SimpleQueue()
    shape_workers = [
        ShapeWorker(shape_timeout, int(available * 0.8 / workers) if available else None) for _ in range(workers)
    ]
    for worker in shape_workers:
        pool.put(worker)

    def measure(item: tuple) -> Measurement:
        run_cfg, weights, _ = item
        if isinstance(run_cfg, Measurement):
            return run_cfg
        worker = pool.get()
        try:
            return _measure(worker, run_cfg, weights, steps, device)
        finally:
            pool.put(worker)

    try:
        with ThreadPoolExecutor(max_workers=workers) as executor:
            return list(
                tqdm(
                    executor.map(measure, prepared),
                    total=len(prepared),
                    desc="preflight",
                    unit="shape",
                    file=sys.stderr,
                    dynamic_ncols=True,
                )
            )
    finally:
        for worker in shape_workers:
            worker.close()


def _measure(worker: ShapeWorker, run_cfg: dict[str, Any], weights: str | None, steps: int, device: str) -> Measurement:
    measurement = worker.measure(run_cfg, steps)
    if weights:
        measurement.notes.append(f"random init ({weights} not cached)")
    if measurement.status != "ok" and measurement.amp != "off" and device == "cpu":
        # the configured autocast may not run on this CPU: measure without it and say so
        error = measurement.error
        measurement = worker.measure(resolve_run_config(deep_merge(run_cfg, {"amp": {"enabled": False}})), steps)
        measurement.notes.append(f"AMP {run_cfg['amp']['dtype']} failed on the CPU ({error}); measured without it")
    return measurement


def _project(
    config: dict[str, Any],
    shape: Shape,
    m: Measurement,
    data_root: str,
    scratch: Path,
    retries: int,
    device: str = "cpu",
) -> list[RunCost]:
    """The cost of every run of a measured shape (a search: its trials × folds runs), k-NN searches
    and k-Center selections timed on ``device`` (projection module docstring)."""
    speed = Speed(m.step_seconds, m.batch_size, m.images_per_second, m.eval_images_per_second, int(m.workers or 0))
    costs = []
    for run in shape.runs:
        counts = _manifest_counts(run.config["dataset"]["name"], data_root, scratch) or stand_in_counts(
            run.config["dataset"]
        )
        e = run.config["eval"]
        knn = _knn_rate(run.config["model"]["embedding_size"], max(e["ks"]), device)
        hours = run_hours(
            run.config,
            counts,
            speed,
            knn,
            functools.partial(_kcenter_seconds, device=device),
            train_classes(run.dataset) or counts.get("train_classes"),
        )
        jobs = 1
        if run.run_id in shape.searches:
            spec = config["experiments"][next(iter(run.experiments))]["search"]
            jobs = spec["trials"] * len(spec.get("folds") or [None])
        budget = budget_hours(config, run.dataset, retries)
        costs.append(RunCost(run.run_id, list(run.experiments), hours * jobs, budget * jobs))
    return costs


@functools.lru_cache(maxsize=64)
def _knn_rate(dim: int, k: int, device: str) -> float:
    return measure_knn(dim, k, device)


@functools.lru_cache(maxsize=256)
def _kcenter_seconds(classes: int, pool: int, p: int, dim: int, device: str = "cpu") -> float:
    return measure_kcenter(classes, pool, p, dim, device)


@functools.lru_cache(maxsize=64)
def _manifest_counts(name: str, data_root: str, scratch: Path) -> dict[str, int] | None:
    """Split counts of a prepared (or generated) dataset; None for a stand-in (its protocol's counts)."""
    root = scratch if name in EMBEDDED else data_root
    return load(name, root).counts() if is_prepared(root, name) else None


#: a JSON config entry's measurements (docs/preflight.md#output)
MEASURED = (
    "step_seconds",
    "images_per_second",
    "synthetic_images_per_second",
    "eval_images_per_second",
    "eval_metric_seconds",
    "peak_memory_mb",
)


def _config_entry(shape: Shape, m: Measurement) -> dict[str, Any]:
    runs = [run.run_id for run in shape.runs]
    return {
        "name": shape.name,
        "runs": runs,
        "status": m.status,
        "error": m.error,
        **{k: getattr(m, k) for k in MEASURED},
    }


def _unresolved_entry(bad) -> dict[str, Any]:
    """An experiment that does not resolve: a failed entry with the same keys, nothing measured."""
    return {
        "name": f"experiment {bad.name}",
        "runs": [],
        "status": "failed",
        "error": bad.error,
        **dict.fromkeys(MEASURED),
    }


# -- the table ------------------------------------------------------------------------------------
def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_table(result: dict[str, Any], configfile: str, retries: int | None) -> str:
    """The printed preflight: the node, the shapes' measurements and notes, the projected hours, the problems."""
    facts = result["json"]["device"]
    lines = [
        f"preflight of {configfile} on {facts['name']} ({facts['device']}; torch {facts['torch']}, CUDA "
        f"{facts['cuda']}, capability {facts['capability']}, bf16 {facts['bf16']}; faiss {facts['faiss']}, "
        f"GPU build {facts['faiss_gpu_build']}, GPU search {facts['faiss_gpu_search']}; "
        f"{facts['cpus']} CPU{'' if facts['cpus'] == 1 else 's'})",
        "",
        *_shape_lines(result),
        "",
        "projected hours, every run to its cap (its budget: time limit × (retries + 1), retries = "
        f"{retries if retries is not None else '0, no profile found'})",
        *_hour_lines(result),
        "",
    ]
    problems = result["problems"]
    if not problems:
        return "\n".join([*lines, "every shape stepped and every run fits its time budget"])
    lines += [f"{len(problems)} problem(s):"] + [f"  {p}" for p in problems[:SHOWN_PROBLEMS]]
    if len(problems) > SHOWN_PROBLEMS:
        lines.append(
            f"  ... and {len(problems) - SHOWN_PROBLEMS} more (every over-budget run id: --json, key over_budget)"
        )
    return "\n".join(lines)


SHAPE_COLUMNS = (
    "shape",
    "runs",
    "status",
    "amp",
    "batch",
    "step s",
    "data img/s",
    "step img/s",
    "eval img/s",
    "metric s",
    "peak MB",
)


def _shape_lines(result: dict[str, Any]) -> list[str]:
    """One row per shape (SHAPE_COLUMNS), then the notes: shared ones with their shape count, then each shape's."""
    body = [
        (
            shape.name,
            str(len(shape.runs)),
            m.status,
            m.amp,
            str(m.batch_size or "-"),
            _num(m.step_seconds, 3),
            _num(m.images_per_second),
            _num(m.synthetic_images_per_second),
            _num(m.eval_images_per_second),
            _num(m.eval_metric_seconds, 3),
            _num(m.peak_memory_mb, 0),
        )
        for shape, m in result["rows"]
    ]
    lines = _columns([SHAPE_COLUMNS, *body])
    for note, names in result["notes"].items():
        lines.append(f"note: {note} ({len(names)} shape{'s' * (len(names) > 1)})")
    lines += [f"note: {shape.name}: {note}" for shape, m in result["rows"] for note in m.notes]
    return lines


def _hour_lines(result: dict[str, Any]) -> list[str]:
    """Hours per experiment (a failed shape's runs counted as not projected) and in total."""
    doc = result["json"]
    projected = {cost.run_id for cost in result["costs"]}

    def missing(run_ids) -> str:
        n = sum(run_id not in projected for run_id in run_ids)
        return f"  ({n} not projected: failed shape)" if n else ""

    return _columns(
        [
            ("experiment", "runs", "hours"),
            *[(e["name"], str(len(e["runs"])), f"{e['hours']:,.2f}{missing(e['runs'])}") for e in doc["experiments"]],
            ("total", str(len(result["costs"])), f"{doc['total_hours']:,.2f}"),
        ]
    )


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]


if __name__ == "__main__":
    sys.exit(main())
