"""The HTML report: one self-contained `index.html` (inline CSS, no scripts, no network) with the
sections' figures copied beside it, rendered from reports/templates/index.html.j2 with Jinja."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

from dmlrepro.atomic import atomic_write_text

TEMPLATE = "index.html.j2"
FIGURES = "figures"


def fmt(value: Any, digits: int = 2, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def render_report(sections: Sequence[Mapping[str, Any]], section_dirs: Sequence[str | os.PathLike],
                  provenance: Mapping[str, Any], out_html: str | os.PathLike, template_dir: str | os.PathLike,
                  title: str = "dmlrepro report") -> None:
    """Copy every section's figures into `<out>/figures/` and write `out_html` last (atomically)."""
    out_html = Path(out_html)
    figures = out_html.parent / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    for section, folder in zip(sections, section_dirs):
        for figure in section["figures"]:
            shutil.copyfile(Path(folder) / figure["file"], figures / figure["file"])
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    html = env.get_template(TEMPLATE).render(title=title, sections=sections, provenance=provenance,
                                             figures_dir=FIGURES)
    atomic_write_text(out_html, html)
