"""Runs -> tables, figures and the HTML report: aggregation, paper-vs-reproduced comparison,
figures, provenance and rendering."""

from .aggregate import aggregate_runs, write_table
from .html import render_report
from .provenance import provenance
from .sections import build_section
from .timing import timing_metrics

__all__ = ["aggregate_runs", "build_section", "provenance", "render_report", "timing_metrics", "write_table"]
