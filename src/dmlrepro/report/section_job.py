"""Rule report_section's work: one experiment's table and runs -> its section folder (section.json,
figures) and runs.json (the experiment's runs for the report's provenance table)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dmlrepro.atomic import write_json_atomic

from .provenance import SECTION_RUNS, section_runs
from .sections import build_section


def write_section(
    name: str,
    experiment: Mapping[str, Any],
    table: str | os.PathLike,
    runs: Sequence[Mapping],
    folder: str | os.PathLike,
    *,
    reported_dir: str | os.PathLike,
    method_configs: Mapping,
    searches: Sequence,
    metrics: Sequence[str],
    train_logs: Sequence[str],
) -> None:
    build_section(
        name,
        experiment,
        pd.read_csv(table),
        runs,
        folder,
        reported_dir=reported_dir,
        method_configs=method_configs,
        searches=searches,
    )
    write_json_atomic(Path(folder) / SECTION_RUNS, section_runs(runs, metrics, train_logs))
