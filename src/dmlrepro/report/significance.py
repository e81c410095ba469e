"""The two-sample t-tests the report's Claims section and its mechanism checks rest on
(docs/report.md#claims): Welch's unequal-variance test and the paired test, both two-sided."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ALPHA = 0.05  # the level of every test of the Claims section


@dataclass(frozen=True)
class TTest:
    """A two-sample t statistic: t, its degrees of freedom and the two-sided p-value."""

    t: float
    df: float
    p: float


def welch_test(a: Sequence[float], b: Sequence[float]) -> TTest | None:
    """Welch's unequal-variance t-test of mean(a) − mean(b), two-sided (Welch 1947):
    t = (ā − b̄) / √(s_a²/n_a + s_b²/n_b), ν = (s_a²/n_a + s_b²/n_b)² / Σ (s²/n)² / (n − 1).
    None when a side has fewer than 2 values or neither side varies (t undefined)."""
    from scipy.stats import t as student  # deferred: scipy.stats, only the tests of a claim need it

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0.0:
        return None
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return TTest(float(t), float(df), float(2.0 * student.sf(abs(t), df)))


def paired_test(a: Mapping[Any, float], b: Mapping[Any, float]) -> TTest | None:
    """Paired t-test over the keys (seeds) both sides have: t = d̄ / (s_d / √n), ν = n − 1.
    None when fewer than 2 pairs or the differences do not vary."""
    from scipy.stats import t as student  # deferred: scipy.stats, only the tests of a claim need it

    common = [k for k in a if k in b]
    d = np.asarray([a[k] - b[k] for k in common], dtype=np.float64)
    if len(d) < 2 or d.std(ddof=1) == 0.0:
        return None
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    return TTest(float(t), float(len(d) - 1), float(2.0 * student.sf(abs(t), len(d) - 1)))
