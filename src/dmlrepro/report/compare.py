"""Paper-shaped comparison tables: the reported value, ours (mean ± std over seeds), Δ, and whether
Δ lies within the combined uncertainty (docs/readings/protocols.md#proto-r5).

Δ = ours − paper in the paper's unit. The combined uncertainty is σ = √(σ_paper² + σ_ours²) with
each σ the printed or measured sample std (a missing one counts as 0); Δ is *within* when
|Δ| ≤ 2σ (about a 95 % band for a difference of two normal means). With no σ at all the verdict
is left open. Runs on a stand-in dataset (reported.is_stand_in) get no Δ.

MLRC tables print ± as a 95 % confidence interval of the mean over reproductions (Musgrave et al.
2020): with `uncertainty="ci95"` ours is mean ± the same CI (aggregate.ci95_half_width) and Δ is
within when |Δ| ≤ √(CI_paper² + CI_ours²), the half-width of a 95 % CI of the difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from .aggregate import with_blank_sweeps
from .reported import is_stand_in, paper_units

WITHIN_SIGMAS = 2.0
#: uncertainty -> (aggregated column suffix of ours, multiple of the combined uncertainty that is "within")
UNCERTAINTIES = {"std": ("std", WITHIN_SIGMAS), "ci95": ("ci95", 1.0)}


def _num(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def verdict(
    paper: float | None,
    paper_std: float | None,
    ours: float | None,
    ours_std: float | None,
    within: float = WITHIN_SIGMAS,
):
    """(Δ, σ, within) for one cell; None where it cannot be said. `within`: |Δ| ≤ within · σ."""
    if paper is None or ours is None:
        return None, None, None
    delta = ours - paper
    sigma = math.hypot(paper_std or 0.0, ours_std or 0.0)
    return delta, (sigma or None), (abs(delta) <= within * sigma if sigma else None)


def row_label(method: str, sweep: str) -> str:
    return f"{method} ({sweep})" if sweep else method


def comparison_table(
    aggregated: pd.DataFrame,
    reported: pd.DataFrame | None,
    metrics: Sequence[str],
    methods: Mapping[str, str],
    datasets: Mapping[str, str],
    expected_seeds: int,
    uncertainty: str = "std",
) -> dict:
    """The table as plain data (JSON-able) for the HTML template.

    `methods` / `datasets` map our names to the printed ones (our names without an entry are
    shown as they are); `reported` may be None (no published table). `uncertainty`: what ± means
    (UNCERTAINTIES: "std" over seeds, or "ci95" of the mean, the MLRC tables' convention)."""
    if uncertainty not in UNCERTAINTIES:
        raise ValueError(f"uncertainty {uncertainty!r}: expected one of {sorted(UNCERTAINTIES)}")
    suffix, within_factor = UNCERTAINTIES[uncertainty]
    aggregated = with_blank_sweeps(aggregated)
    columns = [
        {
            "dataset": datasets.get(d, d),
            "ours_dataset": d,
            "metric": m,
            "stand_in": bool(len(aggregated)) and is_stand_in(d, datasets.get(d, d)),
        }
        for d in _column_datasets(aggregated, reported, datasets)
        for m in metrics
    ]
    paper = (
        {}
        if reported is None
        else {(r.method, r.dataset, r.metric): (r.value, r.std, r.value_text) for r in reported.itertuples()}
    )
    rows = _literature_rows(reported, paper, columns, set(methods.values()))
    for record in aggregated.to_dict("records"):
        printed = methods.get(record["method"])
        cells = [
            _our_cell(
                record,
                column,
                _paper_cell(paper.get((printed, column["dataset"], column["metric"])) if printed else None),
                suffix,
                within_factor,
            )
            for column in columns
        ]
        rows = _merge_row(
            rows,
            {
                "label": row_label(printed or record["method"], record["sweep"]),
                "source": "ours",
                "method": record["method"],
                "status": _status(record, expected_seeds),
                "cells": cells,
            },
        )
    return {"columns": columns, "rows": rows, "uncertainty": uncertainty}


def _column_datasets(aggregated: pd.DataFrame, reported: pd.DataFrame | None, datasets: Mapping[str, str]) -> list[str]:
    """Our datasets in the order of the runs; for a published-only table (no runs) every configured
    dataset, in the reported table's column order."""
    if len(aggregated):
        return list(dict.fromkeys(aggregated["dataset"]))
    printed_order = [] if reported is None else list(dict.fromkeys(reported["dataset"]))
    return sorted(
        datasets,
        key=lambda d: printed_order.index(datasets[d]) if datasets[d] in printed_order else len(printed_order),
    )


def _literature_rows(reported: pd.DataFrame | None, paper: Mapping, columns: list[dict], ours: set[str]) -> list[dict]:
    """The published rows of methods we do not run, in printed order (those with a value in our columns)."""
    rows: list[dict] = []
    if reported is None:
        return rows
    for name in dict.fromkeys(reported["method"]):
        if name in ours:
            continue
        cells = [_paper_cell(paper.get((name, c["dataset"], c["metric"]))) for c in columns]
        if any(cell["paper"] is not None for cell in cells):
            rows.append({"label": name, "source": "paper", "status": "", "cells": cells})
    return rows


def _our_cell(record: Mapping, column: Mapping, cell: dict, suffix: str, within_factor: float) -> dict:
    """One of our cells beside its published value ``cell``: empty outside the record's dataset; on a
    stand-in dataset without the delta and verdict (another dataset's numbers are not comparable)."""
    if record["dataset"] != column["ours_dataset"]:
        return {**cell, "ours": None, "ours_std": None, "delta": None, "sigma": None, "within": None}
    metric = column["metric"]
    ours = _num(record.get(f"{metric}_mean"))
    ours_std = _num(record.get(f"{metric}_{suffix}"))
    ours, ours_std = (None if v is None else paper_units(metric, v) for v in (ours, ours_std))
    delta = sigma = within = None
    if not column["stand_in"]:
        delta, sigma, within = verdict(cell["paper"], cell["paper_std"], ours, ours_std, within_factor)
    return {**cell, "ours": ours, "ours_std": ours_std, "delta": delta, "sigma": sigma, "within": within}


def _paper_cell(found) -> dict:
    if found is None:
        return {"paper": None, "paper_std": None, "paper_text": None}
    value, std, text = found
    return {"paper": _num(value), "paper_std": _num(std), "paper_text": text}


def _status(record: Mapping, expected_seeds: int) -> str:
    seeds, diverged = int(record.get("seeds", 0)), int(record.get("diverged", 0))
    text = f"{seeds - diverged}/{expected_seeds} seeds"
    if diverged:
        text += f", {diverged} diverged"
    return text


def _merge_row(rows: list[dict], row: dict) -> list[dict]:
    """One row per method across datasets: a row for another dataset fills the same label's cells."""
    for existing in rows:
        if existing["source"] == "ours" and existing["label"] == row["label"]:
            for i, cell in enumerate(row["cells"]):
                if cell["ours"] is not None or cell["within"] is not None:
                    existing["cells"][i] = cell
            existing["status"] = "; ".join(dict.fromkeys(filter(None, [existing["status"], row["status"]])))
            return rows
    return [*rows, row]
