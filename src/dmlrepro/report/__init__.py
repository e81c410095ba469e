"""Aggregation of runs into tables (and, later, figures and the HTML report)."""

from .aggregate import aggregate_runs, write_table

__all__ = ["aggregate_runs", "write_table"]
