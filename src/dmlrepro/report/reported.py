"""The papers' published numbers (config/reported/*.csv) and how our metrics line up with them.

The CSVs are in long format (config/reported/README.md): one row per printed number, `value` as
printed text. Our metrics are fractions where the papers print percentages; `paper_units`
converts. A reported dataset name (`CUB-200-2011`) is *the real dataset*; a run on any other
dataset (the embedded default's `double_digits`) is a miniature stand-in, shown beside the paper's
number but never differenced against it.
"""

from __future__ import annotations

import os
import re

import pandas as pd

# our dataset registry name -> the name the papers print
PRINTED_DATASET = {
    "cub200": "CUB-200-2011",
    "cars196": "Cars-196",
    "sop": "SOP",
    "inshop": "In-Shop",
    "mnist": "MNIST",
    "fashion_mnist": "FashionMNIST",
}
# printed in % by the papers, stored as fractions by dmlrepro.evaluation
# (a metric under a test-image corruption or of a printed block keeps its unit: recall@1@gaussian_3)
_PERCENT = re.compile(r"^(recall@\d+|precision@\d+|r_precision|map@r|nmi|accuracy)(@[A-Za-z0-9_.]+)?$")


def is_percent(metric: str) -> bool:
    return bool(_PERCENT.match(metric))


def paper_units(metric: str, value: float) -> float:
    """Our value of `metric` in the unit the papers print it in."""
    return 100.0 * value if is_percent(metric) else value


def load_reported(path: str | os.PathLike, block: str | None = None) -> pd.DataFrame:
    """A reported CSV with `value`/`std` parsed to float (NaN where the cell is text or empty).

    `block` keeps only the rows of that printed block (None: all rows)."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = {"table", "block", "method", "dataset", "metric", "value", "std"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: not a reported-numbers CSV, columns {sorted(missing)} missing")
    if block is not None:
        frame = frame[frame["block"] == block]
        if frame.empty:
            raise ValueError(f"{path}: no rows in block {block!r}")
    frame = frame.copy()
    frame["value_text"] = frame["value"]
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    frame["std"] = pd.to_numeric(frame["std"], errors="coerce")
    return frame.reset_index(drop=True)


def is_stand_in(dataset: str, printed: str) -> bool:
    """True when runs on registry dataset `dataset` only stand in for the paper's `printed` one."""
    return PRINTED_DATASET.get(dataset) != printed
