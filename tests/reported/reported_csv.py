"""Shared helpers for the checks of the transcribed paper numbers in config/reported/.

Used by tests/reported/test_reported.py (PFML), tests/reported/test_reported_rsw.py and
tests/reported/test_reported_asap.py.  Every CSV is read as strings, because the files keep numbers
exactly as printed (e.g. "31.0", "78.11"), and spot values are compared as strings.
"""

from functools import cache
from pathlib import Path

import pandas as pd
import pytest

REPORTED = Path(__file__).resolve().parents[2] / "config" / "reported"

COLUMNS = [
    "table",
    "block",
    "method",
    "citation",
    "backbone",
    "embedding_dim",
    "dataset",
    "metric",
    "value",
    "std",
    "source",
    "note",
]
REQUIRED = ["table", "method", "metric", "value", "source"]
# One row per printed cell: these columns identify it.
KEY = ["block", "method", "backbone", "embedding_dim", "dataset", "metric"]


def read(path):
    """A CSV as a DataFrame of strings ("" for empty cells, never NaN)."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


@cache
def _load(name):
    return read(REPORTED / f"{name}.csv")


def load(name):
    """config/reported/<name>.csv (a fresh copy, so a test may change it)."""
    return _load(name).copy()


def csvs(paper):
    """The reported CSVs of one paper, e.g. csvs("rsw") -> [.../rsw_table1.csv, ...]."""
    return sorted(REPORTED.glob(f"{paper}_*.csv"))


def is_number(s):
    try:
        float(s)
        return True
    except ValueError:
        return False


def rows(df, **where):
    """The rows matching all column==value conditions."""
    mask = pd.Series(True, index=df.index)
    for k, v in where.items():
        mask &= df[k] == v
    return df[mask]


def cell(df, **where):
    """The single row matching all column==value conditions."""
    hit = rows(df, **where)
    assert len(hit) == 1, f"{where}: {len(hit)} rows"
    return hit.iloc[0]


def check(df, value, std="", **where):
    """The single matching row has exactly this value and std (strings, as printed)."""
    r = cell(df, **where)
    assert (r.value, r["std"]) == (value, std), (where, r.value, r["std"])


def _digits_or_empty(df, col, allowed):
    """Non-empty cells of `col` are whole numbers; with allowed=False, all cells are empty."""
    filled = df[col][df[col] != ""]
    if allowed:
        assert filled.str.fullmatch(r"\d+").all(), f"non-integer {col}"
    else:
        assert filled.empty, f"{col} given: {list(filled)}"


def check_format(
    path,
    *,
    text_metrics=frozenset(),
    metrics=None,
    datasets=None,
    source_prefix=None,
    strict_text=False,
    no_dash=False,
    std=True,
    citation=True,
):
    """The format rules shared by all reported CSVs, plus the optional per-paper ones.

    text_metrics: metrics whose value may be text; every other value must parse as a number.
    metrics, datasets: when given, the sets the metric / dataset columns must stay within.
    source_prefix: when given, every source starts with it.
    strict_text: the header line is exactly COLUMNS, no CR line ends, no stray whitespace.
    no_dash: no value contains '-' (no '-' placeholder and no negative number).
    std: False = the paper prints no ± values, so std is empty everywhere; True = where
        std is given it is a number.
    citation: False = citation is empty everywhere; True = where given it is an integer.
    """
    if strict_text:
        text = path.read_text(encoding="utf-8")
        assert text.splitlines()[0] == ",".join(COLUMNS)
        assert "\r" not in text
    df = read(path)
    assert list(df.columns) == COLUMNS
    assert len(df) > 0
    for col in REQUIRED:
        assert (df[col].str.strip() != "").all(), f"empty {col} in {path.name}"
    assert (df["table"] == path.stem).all()
    if strict_text:
        for col in COLUMNS:
            assert (df[col] == df[col].str.strip()).all(), f"stray whitespace in {col}"
    numeric = ~df["metric"].isin(text_metrics)
    bad = df[numeric & ~df["value"].map(is_number)]
    assert bad.empty, bad[["method", "metric", "value"]]
    if no_dash:
        assert not df["value"].str.contains("-").any()
    filled_std = df["std"][df["std"] != ""]
    if std:
        assert filled_std.map(is_number).all()
    else:
        assert filled_std.empty, "the paper prints no ± values"
    _digits_or_empty(df, "citation", citation)
    _digits_or_empty(df, "embedding_dim", True)
    if metrics is not None:
        assert set(df["metric"]) <= metrics, set(df["metric"]) - metrics
    if datasets is not None:
        assert set(df["dataset"]) <= datasets, set(df["dataset"]) - datasets
    if source_prefix is not None:
        assert df["source"].str.startswith(source_prefix).all()
    assert not df.duplicated(KEY).any(), df[df.duplicated(KEY, keep=False)]


def spot_cases(groups):
    """Parametrisation for spot values read from a paper.

    groups: (name, keys, rows) triples: `keys` names the columns that locate a cell in
    table `name`, and each row gives those column values followed by the cell as the
    paper prints it, "value" or "value ± std".  Returns pytest params
    (name, value, std, where) for `check(load(name), value, std, **where)`.
    """
    cases = []
    for name, keys, table in groups:
        for row in table:
            assert len(row) == len(keys) + 1, (name, row)
            *located, printed = row
            value, _, std = printed.partition(" ± ")
            cases.append(pytest.param(name, value, std, dict(zip(keys, located)), id="-".join([name, *located, value])))
    return cases
