"""The report's Claims section: each paper's headline directional claims (config/claims.yaml),
tested over seeds, with a verdict — holds, not reproduced, recipe-sensitive, contradicted or not
testable at this scale (docs/report.md#verdicts).

A claim compares cells (an experiment's method, optionally at a sweep point) on a metric: every
(better, worse) pair of sides on every dataset and metric of the scale is one comparison, tested
with a two-sided Welch t-test over the seeds of the two cells (or a paired t-test over the seeds
both cells have, `test: paired`). A comparison holds when p < 0.05 and Δ = better − worse has the
claimed sign; it contradicts when p < 0.05 / k (k comparisons; Bonferroni) and Δ has the other
sign; otherwise — fewer than 2 finite values on a side, no spread, or p too large — it is
inconclusive. The claim holds when every comparison holds (an intersection–union test, level
0.05), is contradicted when any comparison contradicts (family-wise level 0.05), else inconclusive.

The mechanism checks a claim's scale declares (`checks`: report.mechanisms, with the catalogue's
expected ranges) gate that verdict: when one fails, the claim is "not testable at this scale", with
the failing check named, whatever its comparisons say. A scale's `sensitivity` set trains the claim's
cells under each alternative of a consequential reading: when the comparisons' verdict differs under
one, the claim is "recipe-sensitive", naming the reading. The comparisons' "contradicted" stands only
when every condition of a contradiction holds (`contradiction_unmet`: equal tuning, every side
converged, >= 5 seeds, a sensitivity set that does not flip, every gate passing; "A Metric Learning
Reality Check", Musgrave et al., ECCV 2020); otherwise, and when they are inconclusive, the claim is
"not reproduced". The section is written to claims.json too (`claims_record`), from the same
evaluation the HTML renders.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from dmlrepro.atomic import write_json_atomic

from .aggregate import MLRC_FOLD_KEY, untrained_column
from .mechanisms import CHECKS, run_check
from .readings import ANCHOR as READING
from .reported import load_reported, paper_units
from .significance import ALPHA, TTest, paired_test, welch_test

HOLDS, CONTRADICTED, INCONCLUSIVE = "holds", "contradicted", "inconclusive"  # a comparison's, and the tests' verdict
NOT_TESTABLE = "not testable at this scale"  # a mechanism check failed: the comparisons do not test the claim
NOT_REPRODUCED = "not reproduced"  # the runs do not support the claim, nor earn a contradiction
RECIPE_SENSITIVE = "recipe-sensitive"  # the tests' verdict changes under a consequential reading's alternative
VERDICTS = (HOLDS, NOT_REPRODUCED, RECIPE_SENSITIVE, CONTRADICTED, NOT_TESTABLE)  # a claim's
MIN_SEEDS = 5  # a contradiction needs at least this many seeds on every compared side
TESTS = {"welch": "two-sided Welch t-test", "paired": "two-sided paired t-test (seeds both cells have)"}


def comparison_verdict(delta: float | None, test: TTest | None, sign: int, k: int = 1, alpha: float = ALPHA) -> str:
    """One comparison: holds when p < alpha and sign(Δ) == sign (+1: better is higher, −1: lower);
    contradicted when p < alpha / k with the other sign; inconclusive otherwise."""
    if test is None or delta is None or delta == 0.0:
        return INCONCLUSIVE
    if np.sign(delta) == sign and test.p < alpha:
        return HOLDS
    if np.sign(delta) == -sign and test.p < alpha / k:
        return CONTRADICTED
    return INCONCLUSIVE


def claim_verdict(verdicts: Iterable[str]) -> str | None:
    """All comparisons hold -> holds; any contradicts -> contradicted; else inconclusive (None: no comparison)."""
    verdicts = list(verdicts)
    if not verdicts:
        return None
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return HOLDS if all(v == HOLDS for v in verdicts) else INCONCLUSIVE


# ---- the catalogue ------------------------------------------------------------------------------


def read_catalogue(path: str | os.PathLike) -> dict:
    """The whole catalogue file: `checks` (the mechanism checks' expected ranges) and `claims`."""
    return yaml.safe_load(Path(path).read_text())


def load_catalogue(path: str | os.PathLike) -> list[dict]:
    return list(read_catalogue(path)["claims"])


def load_check_ranges(path: str | os.PathLike) -> dict[str, dict]:
    """check name -> its expected range (`low`, `high`), `what` it measures and its `source` in the papers."""
    return dict(read_catalogue(path).get("checks") or {})


def comparisons(claim: Mapping) -> list[tuple[str, str]]:
    """The claim's (better, worse) side pairs: `pairs`, else every better × every worse."""
    if claim.get("pairs"):
        return [tuple(pair) for pair in claim["pairs"]]
    return list(itertools.product(claim["better"], claim["worse"]))


def scale_spec(claim: Mapping, scale: str | None) -> dict:
    """The claim's entry for `scale` (`scales.<scale>`); a claim without one has no datasets and no cells there."""
    return {"datasets": [], "cells": {}, **((claim.get("scales") or {}).get(scale) or {})}


def _metrics(claim: Mapping, scale: str | None = None) -> list[str]:
    """The claim's metrics, or the scale's own (`scales.<scale>.metrics`) where it names them."""
    return list(scale_spec(claim, scale).get("metrics") or claim["metrics"])


def _experiments(cell: Mapping) -> list[str]:
    found = cell["experiment"]
    return [found] if isinstance(found, str) else list(found)


def check_claims(claims: Sequence[Mapping], config: Mapping, scale: str) -> None:
    """Every claim's cells at `scale` name the config's experiments, their methods, datasets, sweep
    points and metrics; sides and pairs name declared sides. A ValueError names the key otherwise."""
    seen = set()
    for i, claim in enumerate(claims):
        where = f"claims[{i}] ({claim.get('id')})"
        if claim["id"] in seen:
            raise ValueError(f"{where}: the id {claim['id']!r} is used twice")
        seen.add(claim["id"])
        sides = set(claim["sides"])
        for better, worse in comparisons(claim):
            for side in (better, worse):
                if side not in sides:
                    raise ValueError(f"{where}: side {side!r} is not one of sides {sorted(sides)}")
            if better == worse:
                raise ValueError(f"{where}: side {better!r} is compared with itself")
        spec = (claim.get("scales") or {}).get(scale)
        if spec is None:
            continue
        for side, cell in spec["cells"].items():
            if side not in sides:
                raise ValueError(f"{where}.scales.{scale}.cells: {side!r} is not one of sides {sorted(sides)}")
            _check_cell(f"{where}.scales.{scale}.cells.{side}", cell, config, spec["datasets"], _metrics(claim, scale))
        for j, entry in enumerate(spec.get("checks") or []):
            _check_gate(f"{where}.scales.{scale}.checks[{j}]", claim, scale, entry, config)
        for j, alternative in enumerate(spec.get("sensitivity") or []):
            at = f"{where}.scales.{scale}.sensitivity[{j}]"
            for reading in reading_ids(alternative):
                if not READING.match(reading):
                    raise ValueError(f"{at}.reading: {reading!r} is not a reading id like 'pfml-r4'")
            for side, cell in alternative["cells"].items():
                if side not in spec["cells"]:
                    raise ValueError(f"{at}.cells: {side!r} has no cell at scale {scale} ({sorted(spec['cells'])})")
                _check_cell(f"{at}.cells.{side}", cell, config, spec["datasets"], _metrics(claim, scale))
            if alternative.get("tuned"):
                _check_equal_tuning(at, spec["cells"], alternative["cells"], config)


def _check_equal_tuning(where: str, sides: Mapping, cells: Mapping, config: Mapping) -> None:
    """A `tuned` alternative: every side's cell is a search experiment's final runs, its method's open
    hyperparameters searched, with one budget (trials, folds) for all sides (docs/report.md#verdicts)."""
    if set(cells) != set(sides):
        raise ValueError(f"{where}.cells: a tuned alternative names every side ({sorted(sides)}), not {sorted(cells)}")
    budgets = set()
    for side, cell in cells.items():
        for name in _experiments(cell):
            search = config["experiments"][name].get("search")
            if not search or not config["experiments"][name].get("final"):
                raise ValueError(f"{where}.cells.{side}: experiment {name} has no search and final stage to tune it")
            if not ((search.get("method_space") or {}).get(cell["method"]) or search.get("space")):
                raise ValueError(f"{where}.cells.{side}: experiment {name} searches nothing of {cell['method']}")
            budgets.add((search["trials"], tuple(search.get("folds") or ())))
    if len(budgets) > 1:
        raise ValueError(f"{where}: the sides' searches differ in budget (trials, folds): {sorted(budgets)}")


def _check_gate(where: str, claim: Mapping, scale: str, entry: Mapping, config: Mapping) -> None:
    """A mechanism check entry: a known check on a side with a cell at this scale, or on a cell of the config."""
    if entry["check"] not in CHECKS:
        raise ValueError(f"{where}.check: {entry['check']!r} is not one of {sorted(CHECKS)}")
    cells = claim["scales"][scale]["cells"]
    if "side" in entry and entry["side"] not in cells:
        raise ValueError(f"{where}.side: {entry['side']!r} has no cell at scale {scale} ({sorted(cells)})")
    metric = _gate_metric(claim, scale, entry)
    for label, cell in _gate_targets(claim, scale, entry):
        _check_cell(
            f"{where} ({label})",
            cell,
            config,
            claim["scales"][scale]["datasets"],
            [metric] if entry["check"] == "beats_untrained" else [],
        )


def _gate_metric(claim: Mapping, scale: str, entry: Mapping) -> str:
    """The metric a check entry compares (beats_untrained): its own `metric`, else the claim's first."""
    return entry.get("metric") or _metrics(claim, scale)[0]


def _gate_targets(claim: Mapping, scale: str, entry: Mapping) -> list[tuple[str, Mapping]]:
    """(label, cell) the entry checks: its `cell`, its `side`'s cell, or else every side's cell at the scale."""
    cells = claim["scales"][scale]["cells"]
    if "cell" in entry:
        return [(_cell_label(entry["cell"]), entry["cell"])]
    sides = [entry["side"]] if "side" in entry else list(cells)
    return [(claim["sides"][side], cells[side]) for side in sides]


def _cell_label(cell: Mapping) -> str:
    point = ", ".join(f"{k}={v}" for k, v in (cell.get("sweep") or {}).items())
    return f"{'/'.join(_experiments(cell))}: {cell['method']}" + (f" ({point})" if point else "")


def _check_cell(where: str, cell: Mapping, config: Mapping, datasets: Sequence[str], metrics: Sequence[str]):
    names = _experiments(cell)
    for name in names:
        experiment = config["experiments"].get(name)
        if experiment is None:
            raise ValueError(f"{where}.experiment: {name!r} is not an experiment of the config")
        if cell["method"] not in experiment["methods"]:
            raise ValueError(
                f"{where}.method: {cell['method']!r} is not a method of experiment {name} ({experiment['methods']})"
            )
        sweep = experiment.get("sweep") or {}
        for key, value in (cell.get("sweep") or {}).items():
            if key not in sweep or value not in sweep[key]:
                raise ValueError(
                    f"{where}.sweep: {key} = {value!r} is not a sweep point of experiment {name} ({sweep})"
                )
        missing = [k for k in sweep if k not in (cell.get("sweep") or {}) and k != MLRC_FOLD_KEY and len(sweep[k]) > 1]
        if missing:
            raise ValueError(f"{where}.sweep: experiment {name} sweeps {missing}: name the point")
        absent = [m for m in metrics if m not in experiment["metrics"]]
        if absent:
            raise ValueError(f"{where}: experiment {name} has no metric {absent} (metrics {experiment['metrics']})")
    covered = {d for name in names for d in config["experiments"][name]["datasets"]}
    if set(datasets) - covered:
        raise ValueError(f"{where}: no experiment of {names} runs on {sorted(set(datasets) - covered)}")


# ---- evaluation ---------------------------------------------------------------------------------


def _sweep_dict(label: Any) -> dict:
    """aggregate.sweep_label read back: "k1=v1, k2=v2" -> {k1: v1, k2: v2} (values as YAML)."""
    out = {}
    for part in ("" if label is None or (isinstance(label, float) and math.isnan(label)) else str(label)).split(", "):
        if part:
            key, _, text = part.partition("=")
            out[key] = yaml.safe_load(text)
    return out


def cell_values(tables: Mapping[str, pd.DataFrame], cell: Mapping, dataset: str, metric: str) -> dict[Any, float]:
    """seed -> the cell's finite value of `metric` on `dataset`, from the per-seed tables of its
    experiments (aggregate.seed_table, keyed by experiment; a run listed twice counts once)."""
    point = dict(cell.get("sweep") or {})
    values: dict[Any, float] = {}
    for name in _experiments(cell):
        table = tables.get(name)
        if table is None or table.empty or metric not in table:
            continue
        rows = table[(table["method"] == cell["method"]) & (table["dataset"] == dataset)]
        for row in rows.to_dict("records"):
            sweep = _sweep_dict(row["sweep"])
            if all(k in sweep and sweep[k] == v for k, v in point.items()):
                value = row[metric]
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    values.setdefault(int(row["seed"]), float(value))
    return values


def _summary(values: Mapping[Any, float], metric: str) -> dict:
    x = np.asarray([paper_units(metric, v) for v in values.values()], dtype=np.float64)
    return {
        "n": len(x),
        "mean": float(x.mean()) if len(x) else None,
        "std": float(x.std(ddof=1)) if len(x) >= 2 else None,
    }


def _reason(test: TTest | None, a: Mapping, b: Mapping, paired: bool) -> str:
    if test is not None:
        return ""
    if not a or not b:
        return "no finite value on a side (no runs, or diverged)"
    if paired and len([k for k in a if k in b]) < 2:
        return "fewer than 2 seeds on both sides"
    if len(a) < 2 or len(b) < 2:
        return "n < 2 on a side: no spread to test"
    return "no variation: t undefined"


def evaluate_claim(
    claim: Mapping, scale: str, tables: Mapping[str, pd.DataFrame], ranges: Mapping[str, Mapping] | None = None
) -> dict:
    """The claim's comparisons at `scale` from the per-seed tables, each with both sides' mean ± std
    and n (paper units), their untrained values, Δ, t, ν, p and its verdict; the mechanism checks of
    the scale (`ranges`: the catalogue's `checks`); the verdict of the comparisons alone
    (`test_verdict`), the claim's `p`, its sensitivity set's results, the unmet conditions of a
    contradiction and its verdict (None: no cells here; see the module's docstring)."""
    spec = scale_spec(claim, scale)
    rows = compare_cells(claim, scale, spec["cells"], tables)
    # an experiment the workflow did not build (opt-in, a staged run): not run, whatever its gates would find
    built = any(name in tables for cell in spec["cells"].values() for name in _experiments(cell))
    tested = claim_verdict(r["verdict"] for r in rows) if built else None
    checks = [] if tested is None else gate_checks(claim, scale, tables, ranges)
    failing = [c for c in checks if not c["pass"]]
    sensitivity = [] if tested is None else sensitivity_results(claim, scale, tables)
    sensitive_to = [s["reading"] for s in sensitivity if s["test_verdict"] not in (None, tested)]
    unmet = contradiction_unmet(claim, scale, rows, checks, sensitivity)
    return {
        "comparisons": rows,
        "test_verdict": tested,
        "p": claim_p(rows, tested),
        "checks": checks,
        "failing_checks": [f"{c['name']} ({c['target']}, {c['dataset']})" for c in failing],
        "sensitivity": sensitivity,
        "at_plateau": at_plateau(claim, scale, spec["cells"], tables) if tested is not None else {},
        "sensitive_to": sensitive_to,
        "contradiction_unmet": unmet if tested == CONTRADICTED else [],
        "verdict": final_verdict(tested, bool(failing), sensitive_to, unmet),
    }


def final_verdict(tested: str | None, failing: bool, sensitive_to: Sequence[str], unmet: Sequence[str]) -> str | None:
    """A failing gate -> not testable; a sensitivity flip -> recipe-sensitive; the tests' holds -> holds;
    their contradicted with every condition met -> contradicted; otherwise not reproduced."""
    if tested is None:
        return None
    if failing:
        return NOT_TESTABLE
    if sensitive_to:
        return RECIPE_SENSITIVE
    if tested == HOLDS:
        return HOLDS
    return CONTRADICTED if tested == CONTRADICTED and not unmet else NOT_REPRODUCED


def compare_cells(claim: Mapping, scale: str, cells: Mapping[str, Mapping], tables: Mapping[str, pd.DataFrame]):
    """One row per (better, worse) pair with both cells here, dataset and metric of the scale."""
    spec = scale_spec(claim, scale)
    paired = claim.get("test", "welch") == "paired"
    sign = -1 if claim.get("lower_is_better") else 1
    units = [
        (better, worse, dataset, metric)
        for better, worse in comparisons(claim)
        if better in cells and worse in cells
        for dataset in spec["datasets"]
        for metric in _metrics(claim, scale)
    ]
    rows = []
    for better, worse, dataset, metric in units:
        a = cell_values(tables, cells[better], dataset, metric)
        b = cell_values(tables, cells[worse], dataset, metric)
        test = paired_test(a, b) if paired else welch_test(list(a.values()), list(b.values()))
        sa, sb = _summary(a, metric), _summary(b, metric)
        delta = None if sa["mean"] is None or sb["mean"] is None else sa["mean"] - sb["mean"]
        untrained = [
            _summary(cell_values(tables, cells[side], dataset, untrained_column(metric)), metric)
            for side in (better, worse)
        ]
        rows.append(
            {
                "dataset": dataset,
                "metric": metric,
                "better": claim["sides"][better],
                "worse": claim["sides"][worse],
                "a": sa,
                "b": sb,
                "a_untrained": untrained[0],
                "b_untrained": untrained[1],
                "delta": delta,
                "t": None if test is None else test.t,
                "df": None if test is None else test.df,
                "p": None if test is None else test.p,
                "reason": _reason(test, a, b, paired),
                "verdict": comparison_verdict(delta, test, sign, k=len(units)),
            }
        )
    return rows


def reading_ids(alternative: Mapping) -> list[str]:
    """The readings a sensitivity alternative departs from: one id, or several read together (the
    alternatives of PFML-R4 and PFML-R15 at once, "PFML-R4 + PFML-R15")."""
    reading = alternative["reading"]
    return [reading] if isinstance(reading, str) else list(reading)


def sensitivity_results(claim: Mapping, scale: str, tables: Mapping[str, pd.DataFrame]) -> list[dict]:
    """Per alternative of the scale's `sensitivity` set: its reading (as PFML-R4), label, the comparisons
    with the alternative's cells in place of the chosen reading's, and their verdict (None: no runs)."""
    spec = scale_spec(claim, scale)
    out = []
    for alternative in spec.get("sensitivity") or []:
        cells = {**spec["cells"], **alternative["cells"]}
        rows = compare_cells(claim, scale, cells, tables)
        ran = any(r["a"]["n"] and r["b"]["n"] for r in rows)
        out.append(
            {
                "reading": " + ".join(r.upper() for r in reading_ids(alternative)),
                "label": alternative["label"],
                "tuned": bool(alternative.get("tuned")),
                "test_verdict": claim_verdict(r["verdict"] for r in rows) if ran else None,
                "at_plateau": at_plateau(claim, scale, cells, tables),
                "comparisons": [
                    {k: r[k] for k in ("dataset", "metric", "better", "worse", "delta", "p", "verdict")} for r in rows
                ],
            }
        )
    return out


def at_plateau(claim: Mapping, scale: str, cells: Mapping[str, Mapping], tables: Mapping[str, pd.DataFrame]):
    """Per side, how many of its runs early stopping ended at their validation plateau, as "2/3" (the rest
    ran to the cap): an alternative's flip read beside whether its runs converged."""
    datasets, out = scale_spec(claim, scale)["datasets"], {}
    for side, cell in cells.items():
        stopped = [v for d in datasets for v in cell_values(tables, cell, d, "early_stopped").values()]
        if stopped:
            out[claim["sides"][side]] = f"{int(sum(stopped))}/{len(stopped)}"
    return out


def contradiction_unmet(
    claim: Mapping, scale: str, rows: Sequence[Mapping], checks: Sequence[Mapping], sensitivity: Sequence[Mapping]
) -> list[str]:
    """The conditions a contradiction needs that these runs do not meet (docs/report.md#verdicts)."""
    spec = scale_spec(claim, scale)
    unmet = []
    if not any(s["tuned"] and s["test_verdict"] is not None for s in sensitivity):
        unmet.append("equal tuning (no tuned alternative run: the same search budget for every side)")
    sides = {claim["sides"][side] for side in spec["cells"]}
    converged = {c["target"] for c in checks if c["name"] == "validation_plateau" and c["pass"]}
    if not sides <= converged:
        unmet.append("every side converged (validation_plateau on each)")
    seeds = min((min(r["a"]["n"], r["b"]["n"]) for r in rows), default=0)
    if seeds < MIN_SEEDS:
        unmet.append(f">= {MIN_SEEDS} seeds ({seeds})")
    if not sensitivity or any(s["test_verdict"] is None for s in sensitivity):
        unmet.append("a sensitivity set, every alternative run")
    if any(not c["pass"] for c in checks):
        unmet.append("every gate passing")
    return unmet


def gate_checks(
    claim: Mapping, scale: str, tables: Mapping[str, pd.DataFrame], ranges: Mapping[str, Mapping] | None
) -> list[dict]:
    """The scale's mechanism checks (report.mechanisms.run_check) on each of its datasets, each with the
    `target` it checked (a side's label, or the named cell) and its `dataset`."""
    entries = scale_spec(claim, scale).get("checks") or []
    if entries and ranges is None:
        raise ValueError(f"claim {claim['id']}: its checks need the catalogue's expected ranges (`checks`)")
    out = []
    for entry in entries:
        name, metric = entry["check"], _gate_metric(claim, scale, entry)
        for dataset in claim["scales"][scale]["datasets"]:
            for label, cell in _gate_targets(claim, scale, entry):

                def read(column, cell=cell, dataset=dataset):
                    return cell_values(tables, cell, dataset, column)

                out.append(
                    {
                        **run_check(name, ranges[name], read, metric),
                        "target": label,
                        "dataset": dataset,
                        "metric": metric if name == "beats_untrained" else None,
                    }
                )
    return out


def claim_p(rows: Sequence[Mapping], verdict: str | None) -> float | None:
    """The p-value behind the comparisons' verdict: for a contradiction, the smallest p of a comparison
    against the claim times k (Bonferroni, at most 1); otherwise the intersection–union test's, the
    largest p of the comparisons (None when a comparison has no test)."""
    if verdict == CONTRADICTED:
        against = [r["p"] for r in rows if r["verdict"] == CONTRADICTED]
        return min(1.0, min(against) * len(rows))
    ps = [r["p"] for r in rows]
    return None if not ps or any(p is None for p in ps) else max(ps)


def reported_numbers(claim: Mapping, reported_dir: str | os.PathLike) -> list[dict]:
    """The paper's printed numbers of the claim's sides (config/reported/<table>.csv), per printed
    dataset: [{dataset, values: [{side, label, text, std}]}]; a side the paper does not print is left out."""
    spec = claim.get("reported")
    if not spec:
        return []
    frame = load_reported(Path(reported_dir) / f"{spec['table']}.csv", spec.get("block"))
    frame = frame[frame["metric"] == spec.get("metric", _metrics(claim)[0])]
    out = []
    for dataset in spec["datasets"]:
        values = []
        for side, printed in spec["methods"].items():
            hit = frame[(frame["dataset"] == dataset) & (frame["method"] == printed)]
            if len(hit):
                row = hit.iloc[0]
                values.append(
                    {
                        "side": side,
                        "label": claim["sides"][side],
                        "printed": printed,
                        "text": row["value_text"],
                        "std": None if math.isnan(row["std"]) else float(row["std"]),
                    }
                )
        out.append({"dataset": dataset, "values": values})
    return out


def claims_section(
    claims: Sequence[Mapping],
    scale: str,
    tables: Mapping[str, pd.DataFrame],
    reported_dir: str | os.PathLike,
    ranges: Mapping[str, Mapping] | None = None,
) -> dict:
    """The Claims section: for each claim its quote and source, its comparisons, mechanism checks
    (`ranges`: the catalogue's `checks`) and verdict at `scale` (this config's runs), and the paper's
    own numbers for context."""
    out = []
    for claim in claims:
        evaluated = evaluate_claim(claim, scale, tables, ranges)
        out.append(
            {
                "id": claim["id"],
                "paper": claim["paper"],
                "source": claim["source"],
                "quote": claim["quote"],
                "claim": claim["claim"],
                "metrics": _metrics(claim, scale),
                "test": TESTS[claim.get("test", "welch")],
                "lower_is_better": bool(claim.get("lower_is_better")),
                "reported_table": (claim.get("reported") or {}).get("table"),
                "reported_metric": (claim.get("reported") or {}).get("metric", _metrics(claim)[0]),
                "reported": reported_numbers(claim, reported_dir),
                **evaluated,
            }
        )
    counts = {v: sum(c["verdict"] == v for c in out) for v in VERDICTS}
    counts["not run"] = sum(c["verdict"] is None for c in out)
    return {"scale": scale, "alpha": ALPHA, "claims": out, "counts": counts}


#: a check's fields in claims.json
CHECK_FIELDS = (
    "name",
    "target",
    "dataset",
    "metric",
    "value",
    "low",
    "high",
    "expected",
    "pass",
    "n",
    "p",
    "detail",
    "source",
)


def claims_record(section: Mapping | None) -> dict:
    """results/report/claims.json: per claim its id, paper, source, verdict ("not run at this scale"
    when it has no cells here), the comparisons' own verdict, p (claim_p), the failing checks, the
    readings it is sensitive to, the unmet conditions of a contradiction, the sensitivity set's
    per-reading results (each with its runs at their plateau), the chosen cells' runs at their plateau and
    each check's name, target, dataset, value, expected range and pass; the same evaluation as the section."""
    if section is None:
        return {"scale": None, "alpha": ALPHA, "counts": {}, "claims": []}
    claims = [
        {
            "id": c["id"],
            "paper": c["paper"],
            "source": c["source"],
            "verdict": c["verdict"] or "not run at this scale",
            "test_verdict": c.get("test_verdict"),
            "p": c.get("p"),
            "failing_checks": c.get("failing_checks", []),
            "sensitive_to": c.get("sensitive_to", []),
            "contradiction_unmet": c.get("contradiction_unmet", []),
            "sensitivity": c.get("sensitivity", []),
            "at_plateau": c.get("at_plateau", {}),
            "checks": [{k: check.get(k) for k in CHECK_FIELDS} for check in c.get("checks", [])],
            "comparisons": [
                {k: r[k] for k in ("dataset", "metric", "better", "worse", "delta", "p", "verdict")}
                for r in c["comparisons"]
            ],
        }
        for c in section["claims"]
    ]
    return {"scale": section["scale"], "alpha": section["alpha"], "counts": section["counts"], "claims": claims}


def write_claims(section: Mapping | None, path: str | os.PathLike) -> None:
    write_json_atomic(path, claims_record(section))


def seed_tables(experiments: Sequence[str], paths: Sequence[str | os.PathLike]) -> dict[str, pd.DataFrame]:
    """experiment -> its per-seed table (rule aggregate's seeds/<experiment>.csv), in the same order."""
    return {name: pd.read_csv(path) for name, path in zip(experiments, paths, strict=True)}
