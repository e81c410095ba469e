"""Runs -> tables, figures and the HTML report: aggregation, paper-vs-reproduced comparison,
figures, provenance and rendering.

Light names are imported here; the pandas/matplotlib ones load on first access, so that a job
that only aggregates (rule aggregate) or only renders (rule report) does not import matplotlib.
"""

import importlib

from .html import render_report
from .provenance import provenance
from .timing import timing_metrics

_LAZY = {"aggregate_runs": "aggregate", "write_table": "aggregate", "build_section": "sections"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["aggregate_runs", "build_section", "provenance", "render_report", "timing_metrics", "write_table"]
