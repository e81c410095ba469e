"""What the report's sections read from an experiment's runs and configs (report.kinds draws
them): per-epoch curves, ASAP's projections, retrieval queries, a 2-d run's proxies, improvements
over a base loss, timing ratios, hyperparameter rows, printed blocks as metrics."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlrepro.data.manifest import read_manifest
from dmlrepro.nested import dotted_get
from dmlrepro.train.state import RunDir

from .aggregate import sweep_label, untrained_column, with_blank_sweeps
from .compare import row_label
from .reported import paper_units

UNTRAINED_LABEL = "untrained (epoch 0)"


def check_improvement(name: str, experiment: Mapping) -> tuple[str, dict[str, str]]:
    """(metric, base) of an `improvement` report: `report.metric` (default: the first of `metrics`) must
    be one of the experiment's metrics, and `report.base` maps variants to their base loss, both among
    the experiment's methods; a ValueError names the key otherwise."""
    spec, declared = experiment.get("report") or {}, list(experiment.get("methods") or [])
    metrics = list(experiment.get("metrics") or [])
    metric = spec.get("metric", metrics[0] if metrics else None)
    if metric not in metrics:
        raise ValueError(
            f"experiments.{name}.report.metric = {metric!r}: expected one of the experiment's metrics {metrics}"
        )
    base = spec.get("base")
    if not isinstance(base, Mapping) or not base:
        raise ValueError(
            f"experiments.{name}.report.base = {base!r}: expected a mapping variant method -> its base-loss method"
        )
    for variant, parent in base.items():
        if variant not in declared:
            raise ValueError(
                f"experiments.{name}.report.base: {variant!r} is not one of the experiment's methods {declared}"
            )
        if parent not in declared:
            raise ValueError(
                f"experiments.{name}.report.base.{variant} = {parent!r}: the base method is not "
                f"one of the experiment's methods {declared}"
            )
        if parent == variant:
            raise ValueError(f"experiments.{name}.report.base.{variant}: a method is not its own base")
    return metric, dict(base)


def improvement_rows(
    aggregated: pd.DataFrame, metric: str, base: Mapping[str, str], declared: Sequence[str], methods: Mapping[str, str]
) -> list[dict]:
    """ASAP Fig. 5 (ASAP-R22): per (dataset, sweep point) and method, `metric` (mean over seeds, paper units)
    and, for a variant in `base`, its improvement over its base loss on the same dataset and sweep
    point: `delta` = variant − base (paper units), `delta_pct` = 100 · delta / base (None when the base
    is missing or 0). Rows come grouped by base loss: each base (declared order of its first variant's
    base) then its variants in declared order; methods in no pair last, each alone."""
    layout, groups = _improvement_layout(base, declared)
    points, values = _metric_means(aggregated, metric)
    out = []
    for dataset, sweep in points:
        for group, method, role in layout:
            present = [method, *(groups[method] if role == "base" else [])]
            if not any((m, dataset, sweep) in values for m in present):
                continue
            value = values.get((method, dataset, sweep))
            base_value = values.get((group, dataset, sweep)) if role == "variant" else None
            delta = None if value is None or base_value is None else value - base_value
            pct = None if delta is None or base_value == 0 else 100.0 * delta / base_value
            out.append(
                {
                    "dataset": dataset,
                    "sweep": sweep,
                    "method": method,
                    "label": methods.get(method, method),
                    "group": group,
                    "role": role,
                    "base": group if role == "variant" else None,
                    "base_label": methods.get(group, group) if role == "variant" else None,
                    "metric": metric,
                    "value": value,
                    "base_value": base_value,
                    "delta": delta,
                    "delta_pct": pct,
                }
            )
    return out


def _improvement_layout(
    base: Mapping[str, str], declared: Sequence[str]
) -> tuple[list[tuple[str, str, str]], dict[str, list[str]]]:
    """((group, method, role) in row order: each base loss then its variants, then the unpaired methods
    alone; base -> its variants)."""
    order: list[str] = []
    groups: dict[str, list[str]] = {}
    for method in declared:
        parent = base.get(method)
        if parent is not None:
            if parent not in order:
                order.append(parent)
            groups.setdefault(parent, []).append(method)
    drawn = set(order) | {m for ms in groups.values() for m in ms}
    layout = [
        row for parent in order for row in [(parent, parent, "base"), *((parent, m, "variant") for m in groups[parent])]
    ]
    return layout + [(m, m, "alone") for m in declared if m not in drawn], groups


def _metric_means(aggregated: pd.DataFrame, metric: str) -> tuple[list[tuple], dict[tuple, float | None]]:
    """(the (dataset, sweep label) points in table order, (method, dataset, sweep) -> `metric`'s mean in
    paper units, None where NaN)."""
    frame = with_blank_sweeps(aggregated)
    values: dict[tuple, float | None] = {}
    points: list[tuple] = []
    for record in frame.to_dict("records"):
        point = (record["dataset"], record["sweep"])
        if point not in points:
            points.append(point)
        value = record.get(f"{metric}_mean")
        value = None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)
        values[(record["method"], *point)] = None if value is None else paper_units(metric, value)
    return points, values


def projection_steps(runs: Sequence[Mapping]) -> list[dict]:
    """Every closed projection of the runs' validation_log.json (ASAP Fig. 4b)."""
    out = []
    for run in runs:
        path = RunDir(run["dir"]).validation_log
        if not path.is_file():
            raise ValueError(
                f"report kind projection_steps: run {run['run_id']} has no {path.name} "
                f"(not a run with a validation split)"
            )
        log = json.loads(path.read_text())
        for p in log["projections"]:
            out.append(
                {
                    "run_id": run["run_id"],
                    "projection": p["projection"],
                    "steps": p["steps"],
                    "end_reason": p["end_reason"],
                    "steps_per_evaluation": log["steps_per_evaluation"],
                }
            )
    return out


def projection_panels(run: Mapping) -> tuple[list[dict], list[dict]]:
    """Fig. 7 panels of one run: each saved projections/projection-K_val.npz with its MAP@R (leave-one-out
    on the validation classes), average covering radius and mean inter-class distance."""
    # torch (dmlrepro.evaluation): deferred, so that dmlrepro.report imports without it
    from dmlrepro.evaluation import retrieval_metrics
    from dmlrepro.evaluation.embeddings_io import load_embeddings
    from dmlrepro.evaluation.geometry import average_covering_radius, mean_interclass_distance
    from dmlrepro.evaluation.knn import l2_normalize

    files = RunDir(run["dir"]).saved_projections()
    if not files:
        raise ValueError(
            f"report kind projections: run {run['run_id']} saved no validation embeddings "
            f"(set asap.save_val_embeddings: true)"
        )
    panels, rows = [], []
    for path in files:
        found = load_embeddings(path)
        k = int(found.meta.get("projection", len(rows)))
        unit = l2_normalize(found.embeddings)
        row = {
            "run_id": run["run_id"],
            "projection": k,
            "map@r": retrieval_metrics(unit, found.labels, ks=(1,), distance="euclidean")["map@r"],
            "covering_radius": average_covering_radius(unit, found.labels),
            "interclass_distance": mean_interclass_distance(unit, found.labels),
        }
        rows.append(row)
        title = "single proxy-DML (projection 0)" if k == 0 else f"after alternation {k}"
        panels.append(
            {
                "title": title,
                "embeddings": found.embeddings,
                "labels": found.labels,
                "annotation": f"MAP@R {row['map@r']:.3f}\nradius {row['covering_radius']:.3f}\n"
                f"inter-class {row['interclass_distance']:.3f}",
            }
        )
    return panels, rows


def blocks_as_metrics(reported: pd.DataFrame, block_metrics: Mapping[str, str], printed_datasets: Sequence[str]):
    """Reported rows of a printed block as a metric of ours: `block_metrics` maps our metric (e.g.
    `recall@1@gaussian_3`) to the printed block (`Additive Noise: Gaussian`); the printed metric is
    the one our name starts with (`recall@1`). Rows that print no dataset (RSW Table IV) are read
    as `printed_datasets` (the report's dataset mapping). Rows of other blocks are dropped."""
    out = []
    for ours, block in block_metrics.items():
        rows = reported[reported["block"] == block]
        if rows.empty:
            raise ValueError(f"report.block_metrics: no reported rows in block {block!r}")
        rows = rows[[ours == m or ours.startswith(m + "@") for m in rows["metric"]]].assign(metric=ours)
        if rows.empty:
            raise ValueError(f"report.block_metrics: {ours!r} matches no printed metric of block {block!r}")
        for printed in printed_datasets or [""]:
            out.append(rows.assign(dataset=rows["dataset"].where(rows["dataset"] != "", printed)))
    return pd.concat(out, ignore_index=True)


def run_curves(runs: Sequence[Mapping], column: str, methods: Mapping[str, str]) -> list[dict]:
    """Per (method, dataset, sweep point): the mean over seeds of train_log.csv `column` at each epoch
    where it was logged (an epoch missing in some seed's log, e.g. after a divergence, averages the rest)."""
    groups: dict[tuple, list] = {}
    for run in runs:
        path = RunDir(run["dir"]).train_log
        log = pd.read_csv(path)
        if column not in log:
            raise ValueError(
                f"{path} has no column {column!r} (columns: {list(log.columns)}); "
                f"per-epoch proxy metrics need eval.proxy_metrics_per_epoch and eval.every > 0"
            )
        label = row_label(methods.get(run["method"], run["method"]), sweep_label(run.get("sweep") or {}))
        groups.setdefault((label, run["dataset"]), []).append(log)
    datasets = {d for _, d in groups}
    out = []
    for (label, dataset), logs in groups.items():
        merged = pd.concat([log[["epoch", column]].dropna() for log in logs])
        mean = merged.groupby("epoch")[column].mean()
        diverged = any(log["loss"].isna().iloc[-1] and log["epoch"].iloc[-1] > 0 for log in logs)
        out.append(
            {
                "label": label if len(datasets) == 1 else f"{label}, {dataset}",
                "epoch": mean.index.to_numpy(),
                "value": mean.to_numpy(),
                "diverged": diverged,
            }
        )
    return out


def lowest_seed_runs(runs: Sequence[Mapping], key) -> list[Mapping]:
    """The lowest-seed run of each group `key(run)` (the first such run on a tie), groups in declared order."""
    chosen: dict[Any, Mapping] = {}
    for run in runs:
        group = key(run)
        if group not in chosen or run["seed"] < chosen[group]["seed"]:
            chosen[group] = run
    return list(chosen.values())


def first_runs_per_method(runs: Sequence[Mapping]) -> list[Mapping]:
    """The lowest-seed run of each (method, dataset), in declared order."""
    return lowest_seed_runs(runs, lambda run: (run["method"], run["dataset"]))


def embedding_panel(run: Mapping, methods: Mapping[str, str]) -> dict:
    """A 2-d run's test embeddings and its final proxies, each labelled with its training class
    (the run folder's final_proxies.npz, written by the engine when training ends)."""
    # torch (dmlrepro.evaluation): deferred, so that dmlrepro.report imports without it
    from dmlrepro.evaluation.embeddings_io import load_embeddings

    rundir = RunDir(run["dir"])
    found = load_embeddings(rundir.embeddings())
    if not rundir.final_proxies.is_file():
        raise ValueError(
            f"{run['dir']}: no {RunDir.FINAL_PROXIES} to draw (the loss has no proxies, or the run "
            f"finished before runs wrote it: delete its {RunDir.METRICS} and train it again, which "
            f"finishes it from its final checkpoint)"
        )
    with np.load(rundir.final_proxies) as saved:
        proxies, proxy_labels = saved["proxies"], saved["labels"]
    return {
        "title": f"{methods.get(run['method'], run['method'])}\n{run['run_id']}",  # two lines: side-by-side panels
        "embeddings": found.embeddings,
        "labels": found.labels,
        "proxies": proxies,
        "proxy_labels": proxy_labels,
    }


def first_runs_per_dataset(runs: Sequence[Mapping]) -> list[Mapping]:
    """The experiment's first method's lowest-seed run on each dataset."""
    first_method = [run for run in runs if run["method"] == runs[0]["method"]] if runs else []
    return lowest_seed_runs(first_method, lambda run: run["dataset"])


def retrieval_queries(run: Mapping, count: int, k: int) -> list[dict]:
    """`count` seeded queries of the run's test embeddings with their k nearest neighbours."""
    # torch (dmlrepro.evaluation): deferred, so that dmlrepro.report imports without it
    from dmlrepro.evaluation.embeddings_io import load_embeddings
    from dmlrepro.evaluation.knn import knn_search

    found = load_embeddings(RunDir(run["dir"]).embeddings())
    dataset = run["config"]["dataset"]
    manifest = read_manifest(Path(dataset["root"]) / dataset["name"])
    picks = np.random.default_rng(run["seed"]).choice(len(found.labels), size=count, replace=False)
    _, neighbours = knn_search(found.embeddings[picks], k, found.embeddings)
    out = []
    for q, row in zip(picks, neighbours):
        row = [int(i) for i in row if int(i) != int(q)][:k]  # the query itself is not its own neighbour
        out.append(
            {
                "image": manifest.abspath(int(found.indices[q])),
                "label": int(found.labels[q]),
                "neighbours": [(manifest.abspath(int(found.indices[i])), int(found.labels[i])) for i in row],
            }
        )
    return out


def epoch_ratios(aggregated: pd.DataFrame, anchor: str | None, methods: Mapping[str, str]) -> list[dict]:
    """Seconds per epoch of every row over the anchor method's, per dataset (PFML supp. §5)."""
    if not anchor or "seconds_per_epoch_mean" not in aggregated:
        return []
    out = []
    for dataset, rows in aggregated.groupby("dataset", sort=False):
        base = rows.loc[rows["method"] == anchor, "seconds_per_epoch_mean"]
        if base.empty:
            raise ValueError(f"timing: anchor method {anchor!r} has no run on {dataset}")
        for row in rows.itertuples():
            out.append(
                {
                    "dataset": dataset,
                    "label": methods.get(row.method, row.method),
                    "anchor": methods.get(anchor, anchor),
                    "ratio": row.seconds_per_epoch_mean / base.iloc[0],
                }
            )
    return out


def hparam_rows(
    runs: Sequence[Mapping],
    reported: pd.DataFrame | None,
    keys: Mapping[str, str],
    methods: Mapping[str, str],
    datasets: Mapping[str, str],
) -> list[dict]:
    """Rows (hyperparameter, reported value per printed column, our resolved value) for each run:
    `keys` maps the reported `metric` name to our dotted run-config key."""
    out = []
    for run in runs:
        printed_dataset = datasets.get(run["dataset"], run["dataset"])
        for metric, key in keys.items():
            paper = None
            if reported is not None:
                hit = reported[
                    (reported["metric"] == metric)
                    & (reported["dataset"] == printed_dataset)
                    & (reported["method"] == methods.get(run["method"], run["method"]))
                ]
                paper = (
                    "; ".join(f"{v} ({b})" if b else str(v) for v, b in zip(hit["value_text"], hit["backbone"])) or None
                )
            out.append(
                {
                    "run": run["run_id"],
                    "hyperparameter": metric,
                    "key": key,
                    "paper": paper,
                    "ours": dotted_get(run["config"], key),
                }
            )
    return out


def add_untrained_rows(table: dict, aggregated: pd.DataFrame, methods: Mapping[str, str]) -> None:
    """The comparison table's untrained rows (compare.comparison_table's `table`, in place): each run's
    evaluation before training (`<metric>@untrained`, eval.before_training), mean ± the table's
    uncertainty over seeds in the paper's unit, above our rows; rows whose runs start from the same
    network (equal untrained values on a dataset) share one row, labelled with their methods when a
    dataset has several. Each of our cells gets `gain`: its value minus its own runs' untrained value."""
    suffix = table["uncertainty"]
    records = [r for r in aggregated.to_dict("records") if _untrained(r, table["columns"], "mean")]
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        means = tuple(None if v is None else round(v, 9) for v in _untrained(record, table["columns"], "mean"))
        groups.setdefault((record["dataset"], means), []).append(record)
    per_dataset = {}
    for dataset, _ in groups:
        per_dataset[dataset] = per_dataset.get(dataset, 0) + 1
    rows: dict[str, dict] = {}
    for (dataset, _), members in groups.items():
        label = UNTRAINED_LABEL
        if per_dataset[dataset] > 1:
            label += ": " + ", ".join(dict.fromkeys(_label(r, methods) for r in members))
        row = rows.setdefault(
            label,
            {
                "label": label,
                "source": "untrained",
                "status": "before training",
                "cells": [_blank_cell() for _ in table["columns"]],
            },
        )
        first = members[0]
        means = _untrained(first, table["columns"], "mean")
        spreads = _untrained(first, table["columns"], suffix) or [None] * len(means)  # one seed: no spread at all
        for cell, column, mean, spread in zip(row["cells"], table["columns"], means, spreads, strict=True):
            if column["ours_dataset"] == dataset and mean is not None:
                cell.update(
                    ours=paper_units(column["metric"], mean),
                    ours_std=None if spread is None else paper_units(column["metric"], spread),
                )
    _add_gains(table, records, methods)
    first_ours = next((i for i, r in enumerate(table["rows"]) if r["source"] == "ours"), len(table["rows"]))
    table["rows"][first_ours:first_ours] = list(rows.values())


def _untrained(record: Mapping, columns: Sequence[Mapping], stat: str) -> list[float | None]:
    """The record's untrained `stat` per table column (None: another dataset, or not recorded);
    [] when it has none at all."""
    values = []
    for column in columns:
        here = column["ours_dataset"] == record["dataset"]
        value = record.get(f"{untrained_column(column['metric'])}_{stat}") if here else None
        values.append(None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value))
    return values if any(v is not None for v in values) else []


def _label(record: Mapping, methods: Mapping[str, str]) -> str:
    sweep = "" if pd.isna(record["sweep"]) else record["sweep"]
    return row_label(methods.get(record["method"], record["method"]), sweep)


def _blank_cell() -> dict:
    return {
        "paper": None,
        "paper_std": None,
        "paper_text": None,
        "ours": None,
        "ours_std": None,
        "delta": None,
        "sigma": None,
        "within": None,
    }


def _add_gains(table: dict, records: Sequence[Mapping], methods: Mapping[str, str]) -> None:
    ours = {row["label"]: row for row in table["rows"] if row["source"] == "ours"}
    for record in records:
        row = ours.get(_label(record, methods))
        if row is None:
            continue
        for cell, column, before in zip(row["cells"], table["columns"], _untrained(record, table["columns"], "mean")):
            if before is not None and cell["ours"] is not None:
                cell["gain"] = cell["ours"] - paper_units(column["metric"], before)
