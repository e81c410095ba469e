"""Seeds → mean ± std (and 95 % CI) per method and sweep point (docs/architecture.md: aggregate).

The standard deviation is the sample std (ddof = 1), the papers' unstated convention read as in
docs/readings/protocols.md#proto-r5; a group with one seed has std NaN. `<metric>_ci95` is the half-width of the
95 % confidence interval of the mean, t(0.975, n − 1) · std / √n — the MLRC tables' ± over
reproductions (powerful-benchmarker's t-distribution, docs/readings/protocols.md#proto-r3). Diverged runs are
counted in `diverged` and their last finite metrics are kept out of the means, unless the experiment reports them
(`last_finite=True`: RSW Table III prints "the last result preceding numerical instability").
Metrics under test-image corruptions (metrics.json `corruption_metrics`, RSW Table IV) are
flat names such as `recall@1@gaussian_3`.

Beside each metric, `<metric>@untrained` is the run's evaluation before training (metrics.json
`untrained_metrics`, `eval.before_training`): the tables' untrained row and the Claims section's
`beats_untrained` check. The per-seed table also carries what the Claims section's other mechanism
checks read (`MECHANISM_COLUMNS`, report.mechanisms).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from dmlrepro.atomic import atomic_write_text
from dmlrepro.train.state import RunDir

from .timing import timing_metrics

TIMING = ("seconds_per_epoch", "train_hours")  # kept for diverged runs too: they cost the time
UNTRAINED = "@untrained"  # `<metric>@untrained`: the metric of the network before training (epoch 0)
#: per-run inputs of the Claims section's mechanism checks (report.mechanisms): ASAP's alternations, whether
#: validation early-stopped the run, the loss's last-epoch move, an RSW run's final α, the proxy metrics (the
#: loss's δ beside W₂: the bound of its gate, supp. eq. 16)
TRAP_KEYS = (
    "proxy_spread",
    "zero_grad_share",
    "step_ratio",
)  # dmlrepro.evaluation.proxy_trap.TRAP_KEYS (no torch here)
PROXY_COLUMNS = ("w2", "proxy_delta", "avg_dtp", *TRAP_KEYS)  # hidden for a diverged run, as its metrics
MECHANISM_COLUMNS = ("alternations", "early_stopped", "loss_last_change", "rsw_alpha", *PROXY_COLUMNS)


def untrained_column(metric: str) -> str:
    return f"{metric}{UNTRAINED}"


def loss_last_change(train_log: str | os.PathLike) -> float | None:
    """How far the last trained epoch moved the per-epoch training loss, as a share of the loss's range
    over the run: |L_T − L_{T−1}| / (max L − min L) over the epochs with a finite loss (0 when the loss
    never moved; None with fewer than 2 such epochs). Small: the loss had plateaued."""
    log = pd.read_csv(train_log)
    loss = pd.to_numeric(log.loc[log["epoch"] > 0, "loss"], errors="coerce").to_numpy(dtype=float)
    loss = loss[np.isfinite(loss)]
    if len(loss) < 2:
        return None
    spread = float(loss.max() - loss.min())
    return 0.0 if spread == 0.0 else float(abs(loss[-1] - loss[-2]) / spread)


def final_rsw_alpha(config: Mapping[str, Any]) -> float | None:
    """The α of an RSW warp (eq. 7) at the end of training: phase 2's (`followup.loss.alpha`) when the
    run has a second phase, else `loss.hparams.alpha`; None for another loss, the unwarped eq. 4, or an α
    that places no minimum at a distance (∞, 0: RSW Table III's half-warps V5–V8)."""
    loss = config.get("loss") or {}
    hparams = loss.get("hparams") or {}
    if loss.get("name") != "rsw" or hparams.get("warp") is False or hparams.get("function", "warp") != "warp":
        return None
    followup = config.get("followup") or {}
    two_phase = followup.get("epochs") or followup.get("trigger") == "plateau"
    alpha = (followup.get("loss") or {}).get("alpha") if two_phase else None
    alpha = hparams.get("alpha") if alpha is None else alpha
    return float(alpha) if alpha is not None and math.isfinite(float(alpha)) and float(alpha) > 0 else None


def configured_delta(config: Mapping[str, Any]) -> float | None:
    """The δ (δ_att) a PFML or CPML run config states: W₂'s gate bound for a run whose metrics.json predates
    `proxy_metrics.proxy_delta` (None where the config leaves δ to the loss's default)."""
    loss = config.get("loss") or {}
    delta = (loss.get("hparams") or {}).get("delta")
    return float(delta) if loss.get("name") in ("pfml", "cpml") and delta is not None else None


def run_mechanism(result: Mapping[str, Any], train_log: str | os.PathLike, config: Mapping[str, Any]) -> dict:
    """A run's inputs of the mechanism checks that its metrics do not hold: ASAP's alternations and
    the early stop (metrics.json `validation`), the loss's last-epoch move (train_log.csv), the final α,
    the configured δ (configured_delta)."""
    out: dict[str, float] = {}
    validation = result.get("validation") or {}
    if validation:
        out["alternations"] = float(validation.get("alternations", 0))
        out["early_stopped"] = float(bool(validation.get("early_stopped")))
    change = loss_last_change(train_log)
    if change is not None and result.get("status") != "diverged":
        out["loss_last_change"] = change
    alpha = final_rsw_alpha(config)
    if alpha is not None:
        out["rsw_alpha"] = alpha
    delta = configured_delta(config)
    if delta is not None:
        out["proxy_delta"] = delta
    return out


def sweep_label(point: Mapping[str, Any]) -> str:
    """A sweep point as the tables' `sweep` column shows it: "k1=v1, k2=v2" (keys sorted); {} -> ""."""
    return ", ".join(f"{k}={v}" for k, v in sorted(point.items()))


def with_blank_sweeps(aggregated: pd.DataFrame) -> pd.DataFrame:
    """The aggregated table with the empty sweep point as "" (a table read back from CSV has NaN there)."""
    if not len(aggregated):
        return aggregated
    return aggregated.assign(sweep=aggregated["sweep"].astype(object).where(aggregated["sweep"].notna(), ""))


def sweep_points(aggregated: pd.DataFrame, key: str) -> pd.Series:
    """The swept value of `key` in each row of an aggregated table (sweep_label read back)."""

    def value(sweep):
        for part in str(sweep or "").split(", "):
            name, _, text = part.partition("=")
            if name == key:
                return yaml.safe_load(text)
        raise ValueError(f"sweep {sweep!r} has no key {key!r}")

    return aggregated["sweep"].map(value)


def seed_table(records: Iterable[Mapping[str, Any]], metrics: list[str], *, last_finite: bool = False) -> pd.DataFrame:
    """One row per record (a run, or an MLRC reproduction): method, dataset, sweep (sweep_label),
    seed, diverged, each metric's value and its untrained value (`<metric>@untrained`), and the
    mechanism checks' inputs (MECHANISM_COLUMNS not among the metrics) — the per-seed values behind
    aggregate_runs' means (the Claims section tests over them). Records and `last_finite` as in
    aggregate_runs; a record's `mechanism` is run_mechanism's (NaN where absent)."""
    rows = []
    extra = [c for c in MECHANISM_COLUMNS if c not in metrics]
    columns = [*metrics, *(untrained_column(m) for m in metrics), *extra]
    for record in records:
        result = record["result"]
        row = {
            "method": record["method"],
            "dataset": record["dataset"],
            "sweep": sweep_label(record["sweep"]),
            "seed": record["seed"],
            "diverged": result.get("status") == "diverged",
        }
        mechanism = record.get("mechanism") or {}
        measured = {
            **(record.get("timing") or {}),
            **{k: v for k, v in mechanism.items() if k in PROXY_COLUMNS},  # the config's δ, under the recorded one
            **(result.get("proxy_metrics") or {}),
            **(result.get("corruption_metrics") or {}),
            **(result.get("metrics") or {}),
            **{untrained_column(k): v for k, v in (result.get("untrained_metrics") or {}).items()},
            **{k: v for k, v in mechanism.items() if k not in PROXY_COLUMNS},
        }
        for metric in columns:
            value = measured.get(metric)
            shown = metric in TIMING or metric.endswith(UNTRAINED) or (metric in extra and metric not in PROXY_COLUMNS)
            hidden = row["diverged"] and not shown and not last_finite
            row[metric] = float("nan") if value is None or hidden else float(value)
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", "dataset", "sweep", "seed", "diverged", *columns])


def aggregate_runs(
    records: Iterable[Mapping[str, Any]], metrics: list[str], *, last_finite: bool = False
) -> pd.DataFrame:
    """One row per (method, dataset, sweep point): `<metric>_mean`, `_std`, `_ci95`, seeds, diverged.

    Each record holds `method`, `dataset`, `sweep` (a mapping), `seed`, `result` (the run's
    metrics.json content: `status`, `metrics` and, where asked for, `proxy_metrics`) and
    optionally `timing` (report.timing.timing_metrics of its train_log.csv). `last_finite`: a
    diverged run contributes its last finite evaluation instead of NaN."""
    keys = ["method", "dataset", "sweep"]
    frame = seed_table(records, metrics, last_finite=last_finite)
    columns = [*metrics, *(untrained_column(m) for m in metrics)]  # `<metric>@untrained_mean`: the untrained row
    if frame.empty:  # an experiment without runs (a figure drawn from the config alone)
        return pd.DataFrame(
            columns=[*keys, *(f"{m}_{s}" for m in columns for s in ("mean", "std", "ci95")), "seeds", "diverged"]
        )
    grouped = frame.groupby(keys, sort=False)
    table = grouped["seed"].count().rename("seeds").to_frame()
    if metrics:
        stats = grouped[columns].agg(["mean", "std", "count"])
        for metric in columns:
            stats[(metric, "ci95")] = ci95_half_width(stats[(metric, "std")], stats[(metric, "count")])
        stats = stats.drop(columns=[(metric, "count") for metric in columns])
        stats.columns = [f"{metric}_{stat}" for metric, stat in stats.columns]
        table = stats.assign(seeds=table["seeds"])
    table["diverged"] = grouped["diverged"].sum()
    return table.reset_index()


def ci95_half_width(std, n):
    """t(0.975, n − 1) · std / √n elementwise (NaN for n < 2): the half-width of a 95 % CI of a mean."""
    from scipy.stats import t  # deferred: scipy.stats, only the confidence intervals need it

    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n >= 2, t.ppf(0.975, np.maximum(n - 1, 1)) * np.asarray(std, dtype=float) / np.sqrt(n), np.nan)


#: the sweep key that numbers an MLRC experiment's fold runs (run config validation.fold)
MLRC_FOLD_KEY = "validation.fold"


def mlrc_records(records: Iterable[Mapping[str, Any]], fold_key: str = MLRC_FOLD_KEY) -> list[dict[str, Any]]:
    """Fold runs → one record per (method, dataset, other sweep keys, seed), MLRC protocol
    (Musgrave et al. 2020; docs/readings/protocols.md#proto-r3): `<metric>@separated` is the mean of the
    fold models' own test metrics (the "128-dim" block), `<metric>@concatenated` the metrics of
    their concatenated test embeddings (the "512-dim" block, evaluation.mlrc), and `<metric>@complete`
    the test metrics of the group's Complete run where the final stage has one (sweep key
    `complete`, RSW App. D-B). A group with a diverged or unfinished run is a diverged record. Each
    record needs `dir` (the run folder)."""
    groups, complete = _fold_groups(records, fold_key)
    out = []
    for (method, dataset, label, seed), group in groups.items():
        folds = [group["folds"][k] for k in sorted(group["folds"])]
        results = [f["result"] for f in folds]
        diverged = any(r.get("status") != "completed" for r in results)
        metrics = {} if diverged else _ensemble_metrics(folds)
        untrained = {f"{name}@separated": value for name, value in _fold_means(results, "untrained_metrics").items()}
        whole = complete.pop((method, dataset, label, seed), None)
        if whole is not None:  # the Complete run's metrics beside the folds'
            diverged = diverged or whole["result"].get("status") != "completed"
            for key, target in (("metrics", metrics), ("untrained_metrics", untrained)):
                target.update({f"{name}@complete": v for name, v in (whole["result"].get(key) or {}).items()})
        out.append(
            {
                "method": method,
                "dataset": dataset,
                "sweep": group["sweep"],
                "seed": seed,
                "folds": len(folds),
                "result": {
                    "status": "diverged" if diverged else "completed",
                    "metrics": metrics,
                    "untrained_metrics": untrained,
                    "proxy_metrics": _fold_means(results, "proxy_metrics"),
                },
                "mechanism": _fold_mechanism([f.get("mechanism") or {} for f in folds]),
                "timing": _ensemble_timing(folds),
            }
        )
    if complete:
        method, dataset, sweep, seed = next(iter(complete))
        raise ValueError(
            f"MLRC experiment: a Complete run ({method}, {dataset}, {sweep!r}, seed {seed}) has no fold runs"
        )
    return out


def _fold_groups(records: Iterable[Mapping[str, Any]], fold_key: str) -> tuple[dict[tuple, dict], dict[tuple, dict]]:
    """(group key -> {"sweep": the sweep without the fold, "folds": fold -> record}, group key -> the
    final stage's Complete run, RSW App. D-B); a group key is (method, dataset, sweep label, seed)."""
    from dmlrepro.tuning.final import COMPLETE_KEY  # torch: deferred, so that dmlrepro.report imports without it

    groups: dict[tuple, dict[str, Any]] = {}
    complete: dict[tuple, dict[str, Any]] = {}
    for record in records:
        sweep = dict(record["sweep"])
        if sweep.pop(COMPLETE_KEY, False):
            complete[(record["method"], record["dataset"], sweep_label(sweep), record["seed"])] = record
            continue
        if fold_key not in sweep:
            raise ValueError(
                f"MLRC experiment: run {record.get('run_id')} has no sweep key {fold_key!r} "
                f"(sweep {sweep}); sweep {fold_key}: [0, 1, 2, 3]"
            )
        fold = sweep.pop(fold_key)
        key = (record["method"], record["dataset"], sweep_label(sweep), record["seed"])
        groups.setdefault(key, {"sweep": sweep, "folds": {}})["folds"][fold] = record
    return groups, complete


def _ensemble_metrics(folds: list[Mapping[str, Any]]) -> dict[str, float]:
    """`<metric>@separated` (the mean of the fold models' metrics, where every fold has it) and
    `<metric>@concatenated` (their concatenated test embeddings) of completed fold runs."""
    from dmlrepro.evaluation.mlrc import fold_ensemble_metrics  # torch: deferred, as above

    results = [f["result"] for f in folds]
    metrics: dict[str, float] = {}
    for name in results[0].get("metrics") or {}:
        values = [r["metrics"].get(name) for r in results]
        if all(v is not None for v in values):
            metrics[f"{name}@separated"] = sum(values) / len(values)
    queries, galleries = _fold_embedding_files(folds)
    ensemble = fold_ensemble_metrics(queries, ks=results[0].get("ks") or (1,), gallery_files=galleries)
    metrics.update({f"{name}@concatenated": value for name, value in ensemble.items()})
    return metrics


def _ensemble_timing(folds: list[Mapping[str, Any]]) -> dict[str, float]:
    """The whole ensemble's cost: its folds' training hours summed, their seconds per epoch averaged
    (empty unless every fold has them)."""
    timings = [f.get("timing") or {} for f in folds]
    if not all("train_hours" in t for t in timings):
        return {}
    return {
        "train_hours": sum(t["train_hours"] for t in timings),
        "seconds_per_epoch": sum(t["seconds_per_epoch"] for t in timings) / len(timings),
    }


def _fold_means(results: list[Mapping[str, Any]], key: str) -> dict[str, float]:
    """The mean over the fold runs of each value of `result[key]` that every fold has."""
    found = [r.get(key) or {} for r in results]
    return (
        {
            name: sum(f[name] for f in found) / len(found)
            for name in found[0]
            if all(f.get(name) is not None for f in found)
        }
        if found
        else {}
    )


#: how the fold runs of an MLRC reproduction combine into its mechanism value: every fold must alternate
#: and stop early (the fewest), every fold's loss plateau (the largest move); α is the method's
_FOLD_COMBINE = {"alternations": min, "early_stopped": min, "loss_last_change": max, "rsw_alpha": min}


def _fold_mechanism(folds: list[Mapping[str, float]]) -> dict[str, float]:
    return {
        name: combine(f[name] for f in folds)
        for name, combine in _FOLD_COMBINE.items()
        if folds and all(name in f for f in folds)
    }


def _fold_embedding_files(folds: list[Mapping[str, Any]]) -> tuple[list, list | None]:
    """The fold runs' saved test embeddings, and their gallery embeddings where the first fold has some."""
    dirs = [RunDir(f["dir"]) for f in folds]
    gallery = [d.embeddings(gallery=True) for d in dirs]
    return [d.embeddings() for d in dirs], gallery if gallery[0].is_file() else None


def write_table(table: pd.DataFrame, path: str | os.PathLike) -> None:
    atomic_write_text(path, table.to_csv(index=False, float_format="%.6g"))


def write_experiment_tables(
    records: list[Mapping[str, Any]],
    metric_files: list[str],
    train_logs: list[str],
    metrics: list[str],
    *,
    mlrc: bool,
    last_finite: bool,
    table: str,
    seeds: str,
) -> None:
    """Rule aggregate: the experiment's runs (record, metrics.json, train_log.csv) -> its table
    (mean ± std per cell) and its per-seed values (the Claims section's input)."""
    rows = []
    for record, path, log in zip(records, metric_files, train_logs):
        with open(path) as handle:
            result = json.load(handle)
        config = yaml.safe_load(RunDir(Path(path).parent).config.read_text())  # the run's resolved config
        rows.append(
            {**record, "result": result, "timing": timing_metrics(log), "mechanism": run_mechanism(result, log, config)}
        )
    if mlrc:  # fold runs -> separated / concatenated records
        rows = mlrc_records(rows)
    write_table(aggregate_runs(rows, metrics, last_finite=last_finite), table)
    write_table(seed_table(rows, metrics, last_finite=last_finite), seeds)
