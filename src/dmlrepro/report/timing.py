"""Training time of a run, read from its train_log.csv (PFML supp. Table 6, the report's cost columns)."""

from __future__ import annotations

import csv
import os


def epoch_seconds(train_log: str | os.PathLike) -> list[float]:
    """Training seconds of every trained epoch (row 0, the untrained evaluation, left out)."""
    with open(train_log, newline="") as handle:
        return [
            float(row["seconds"])
            for row in csv.DictReader(handle)
            if int(row["epoch"]) > 0 and row["seconds"] not in ("", None)
        ]


def timing_metrics(train_log: str | os.PathLike) -> dict[str, float]:
    """`seconds_per_epoch` (mean over trained epochs) and `train_hours` (their sum), as metrics."""
    seconds = epoch_seconds(train_log)
    if not seconds:
        return {}
    return {"seconds_per_epoch": sum(seconds) / len(seconds), "train_hours": sum(seconds) / 3600.0}
