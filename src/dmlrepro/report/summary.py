"""The report's summary table, first on the page (docs/report.md#the-summary-table): one row per
experiment section (a paper's table or figure) with its headline cell — ours, the paper's value, Δ and
the verdict of report.compare — how many of the section's compared cells lie within the combined
uncertainty, and a link to the section; an experiment the workflow did not build is a row "not run",
with the reason."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def summary_rows(sections: Sequence[Mapping[str, Any]], not_run: Iterable[Mapping[str, str]] = ()) -> list[dict]:
    """The built sections' rows in page order, then one row per entry of `not_run`
    (`{"experiment": name, "reason": text}`, the sections the workflow left out)."""
    rows = [_section_row(s) for s in sections]
    for entry in not_run:
        if "experiment" not in entry or "reason" not in entry:
            raise ValueError(f"not_run entry {dict(entry)!r}: expected keys 'experiment' and 'reason'")
        rows.append({"experiment": entry["experiment"], "title": entry["experiment"], "not_run": entry["reason"]})
    return rows


def _section_row(section: Mapping[str, Any]) -> dict:
    row = {"experiment": section["experiment"], "title": section.get("title") or section["experiment"]}
    table = section.get("table")
    if not table:
        return {**row, "shows": _what_it_shows(section)}
    if not any(r["source"] == "ours" for r in table["rows"]):  # datasets: [] (RSW Tables V-VIII): nothing rerun
        return {**row, "shows": "the paper's numbers alone"}
    compared = [
        cell for r in table["rows"] if r["source"] == "ours" for cell in r["cells"] if cell.get("delta") is not None
    ]
    return {
        **row,
        "headline": headline(table, section.get("headline")),
        "compared": len(compared),
        "within": sum(bool(cell.get("within")) for cell in compared),
        "stand_in": any(c.get("stand_in") for c in table["columns"]),
    }


def headline(table: Mapping[str, Any], method: str | None = None) -> dict | None:
    """The section's headline cell: the first of our rows (`method`'s, the experiment's `report.headline`;
    without one, the experiment's first method, as declared) at its first cell with a paper value beside it,
    else its first cell with a value; None without one."""
    for row in table["rows"]:
        if row["source"] != "ours" or (method is not None and row.get("method") != method):
            continue
        cells = [(c, cell) for c, cell in zip(table["columns"], row["cells"]) if cell.get("ours") is not None]
        if cells:
            column, cell = next(((c, cell) for c, cell in cells if cell.get("paper_text")), cells[0])
            return {"label": row["label"], "dataset": column["dataset"], "metric": column["metric"], **cell}
    return None


def _what_it_shows(section: Mapping[str, Any]) -> str:
    """A table-less section's content in a few words (its kind's figures or tables)."""
    parts = []
    if section.get("figures"):
        n = len(section["figures"])
        parts.append(f"{n} figure{'s' if n > 1 else ''}")
    for key, what in (("ratios", "time ratios"), ("hparams", "hyperparameters"), ("proxy_geometry", "proxy geometry")):
        if section.get(key):
            parts.append(what)
    return ", ".join(parts) or "notes"
