"""The HTML report: one self-contained `index.html` (inline CSS, no scripts, no network) with the
sections' figures copied beside it, rendered from reports/templates/index.html.j2 with Jinja. The page opens
with the summary table (dmlrepro.report.summary); a section's `readings` become links to docs/readings
(dmlrepro.report.readings)."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from dmlrepro.atomic import atomic_write_text

from .readings import reading_links, readings_dir_of
from .summary import summary_rows

TEMPLATE = "index.html.j2"
FIGURES = "figures"
#: the most columns of a comparison table drawn side by side: ASAP Table 1's 16 (4 datasets x 4 MLRC metrics)
#: or RSW Table IV's 10 corruptions in one table run past a 1,400 px window (docs/report.md#reading-a-table)
MAX_COLUMNS = 8


def fmt(value: Any, digits: int = 2, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def pvalue(value: float | None) -> str:
    """A p-value as the Claims section prints it: 3 significant digits, "< 0.001" below 0.001."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return "< 0.001" if value < 0.001 else f"{value:.3g}"


def breakable(text: str) -> Markup:
    """A metric name that may wrap after each "@" (precision@1@<wbr>concatenated), escaped."""
    return Markup(str(escape(text)).replace("@", "@<wbr>"))


def table_blocks(table: Mapping[str, Any], limit: int = MAX_COLUMNS) -> list[dict]:
    """A comparison table (report.compare) as blocks of at most `limit` columns, each drawn as its own table:
    the datasets in their order, whole where they fit beside the previous ones, one wider than `limit` split
    evenly. Each block: `index` (its columns), `groups` (the header's datasets: dataset, stand_in,
    ours_dataset, span) and `rows` (the table's rows that show something there: a printed row only
    where the paper prints one of the block's values)."""
    columns = table["columns"]
    parts: list[list[int]] = []
    for i, column in enumerate(columns):  # consecutive columns of one dataset
        if parts and columns[parts[-1][0]]["ours_dataset"] == column["ours_dataset"]:
            parts[-1].append(i)
        else:
            parts.append([i])
    parts = [piece for part in parts for piece in _split_evenly(part, limit)]
    blocks: list[list[int]] = []
    for part in parts:
        if blocks and len(blocks[-1]) + len(part) <= limit:
            blocks[-1].extend(part)
        else:
            blocks.append(list(part))
    return [_block(table, index) for index in blocks]


def _split_evenly(part: list[int], limit: int) -> list[list[int]]:
    pieces = -(-len(part) // limit)
    size = -(-len(part) // pieces)
    return [part[k : k + size] for k in range(0, len(part), size)]


def _block(table: Mapping[str, Any], index: list[int]) -> dict:
    groups: list[dict] = []
    for i in index:
        column = table["columns"][i]
        if groups and groups[-1]["ours_dataset"] == column["ours_dataset"]:
            groups[-1]["span"] += 1
        else:
            groups.append({**column, "span": 1})
    rows = [
        row
        for row in table["rows"]
        if row["source"] != "paper" or any(row["cells"][i].get("paper_text") for i in index)
    ]
    return {"index": index, "groups": groups, "rows": rows}


def render_report(
    sections: Sequence[Mapping[str, Any]],
    section_dirs: Sequence[str | os.PathLike],
    provenance: Mapping[str, Any],
    out_html: str | os.PathLike,
    template_dir: str | os.PathLike,
    title: str = "dmlrepro report",
    readings_dir: str | os.PathLike | None = None,
    claims: Mapping[str, Any] | None = None,
    not_run: Iterable[Mapping[str, str]] = (),
) -> None:
    """Copy every section's figures into `<out>/figures/` and write `out_html` last (atomically).

    `readings_dir`: the docs/readings the sections' `readings` link to (default: the one of the
    repository whose reports/templates is `template_dir`). `not_run`: the experiments the workflow did not
    build, each `{"experiment": name, "reason": text}`, shown in the summary table as "not run — reason"."""
    out_html = Path(out_html)
    summary = summary_rows(sections, not_run)  # first: a malformed not_run entry fails before any copy
    if readings_dir is None:
        readings_dir = readings_dir_of(Path(template_dir).resolve().parents[1])
    sections = [
        {
            **s,
            "reading_links": reading_links(
                s.get("readings") or (),
                readings_dir,
                out_html.parent,
                f"experiments.{s.get('experiment')}.report.readings",
            ),
            "table_blocks": table_blocks(s["table"]) if s.get("table") else [],
        }
        for s in sections
    ]
    figures = out_html.parent / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    for section, folder in zip(sections, section_dirs):
        for figure in section["figures"]:
            shutil.copyfile(Path(folder) / figure["file"], figures / figure["file"])
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fmt"] = fmt
    env.filters["pvalue"] = pvalue
    env.filters["breakable"] = breakable
    html = env.get_template(TEMPLATE).render(
        title=title,
        summary=summary,
        sections=sections,
        provenance=provenance,
        figures_dir=FIGURES,
        claims=claims,
    )  # claims: report.claims
    atomic_write_text(out_html, html)
