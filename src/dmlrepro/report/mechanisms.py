"""The mechanism checks that gate the Claims section's verdicts (docs/report.md#mechanism-checks).

Before a claim holds or is contradicted, its runs must show the mechanism its paper relies on: a
claim whose check fails is "not testable at this scale", with the failing check named. Each check
reads one cell's per-seed values (the per-seed tables of rule aggregate: report.aggregate.seed_table)
on one dataset and compares a number with the expected range of the catalogue (config/claims.yaml
`checks`: `low`, `high` and the paper's table or section they come from):

  beats_untrained     the cell's metric after training minus the same runs' untrained evaluation
                      (`<metric>@untrained`), mean over seeds in the paper's unit; passes above `low`
                      with a two-sided paired t-test p < 0.05 over the seeds (training adds)
  pfml_w2             PFML's W₂ between proxies and their closest data over the run's δ, mean over the cell's runs
  rsw_dtp_alpha       AvgDTP / α of an RSW warp (eq. 9 over eq. 7's α), mean over the cell's runs
  asap_alternations   the fewest alternations among the cell's runs
  validation_plateau  the share of the cell's runs that validation early stopping ended
  loss_plateau        the largest last-epoch move of the training loss (share of its range over the
                      run, report.aggregate.loss_last_change) among the cell's runs
  proxy_spread        the proxy-trap diagnostics (dmlrepro.evaluation.proxy_trap, eval.proxy_metrics:
  proxy_zero_grad     [trap]): a class's proxy spread over δ (lowest of the runs), the share of zero
  proxy_step          proxy gradients (highest) and Adam's median step over lr·√D (lowest)

A value that the runs do not record fails its check, with what would record it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .aggregate import untrained_column
from .reported import paper_units
from .significance import ALPHA, paired_test

#: reads one column of the checked cell on the checked dataset: seed -> finite value
Read = Callable[[str], dict[Any, float]]


@dataclass(frozen=True)
class Measured:
    """What a check measured: the value compared with the range (None: not recorded), how many runs
    it rests on, the paired test's p (beats_untrained) and, when it is None, why."""

    value: float | None
    n: int
    p: float | None = None
    missing: str = ""


def _mean(values: Mapping[Any, float]) -> float | None:
    return float(np.mean(list(values.values()))) if values else None


def beats_untrained(read: Read, metric: str) -> Measured:
    trained, untrained = read(metric), read(untrained_column(metric))
    seeds = [s for s in trained if s in untrained]
    if not seeds:
        return Measured(
            None,
            0,
            missing=(
                "no untrained evaluation (run config eval.before_training: true records metrics.json untrained_metrics)"
                if trained
                else f"no finite {metric}"
            ),
        )
    after = {s: paper_units(metric, trained[s]) for s in seeds}
    before = {s: paper_units(metric, untrained[s]) for s in seeds}
    test = paired_test(after, before)
    return Measured(float(np.mean([after[s] - before[s] for s in seeds])), len(seeds), None if test is None else test.p)


def pfml_w2(read: Read, metric: str) -> Measured:
    """W₂ over each run's own δ (supp. eq. 16 bounds W₂ by δ): a δ changed in the recipe moves the bound."""
    w2, delta = read("w2"), read("proxy_delta")
    ratios = {s: w2[s] / delta[s] for s in w2 if s in delta}
    why = (
        "no W₂ (run config eval.proxy_metrics: [w2])"
        if not w2
        else "no δ beside W₂ (metrics.json proxy_metrics proxy_delta: a loss with a δ, evaluated by this version)"
    )
    return Measured(_mean(ratios), len(ratios), missing=why)


def rsw_dtp_alpha(read: Read, metric: str) -> Measured:
    dtp, alpha = read("avg_dtp"), read("rsw_alpha")
    ratios = {s: dtp[s] / alpha[s] for s in dtp if s in alpha}
    why = "no AvgDTP (run config eval.proxy_metrics: [avg_dtp])" if not dtp else "no warp α (an RSW loss with eq. 7)"
    return Measured(_mean(ratios), len(ratios), missing=why)


def asap_alternations(read: Read, metric: str) -> Measured:
    values = read("alternations")
    return Measured(
        min(values.values()) if values else None,
        len(values),
        missing="no validation summary (metrics.json validation: runs with a validation split)",
    )


def validation_plateau(read: Read, metric: str) -> Measured:
    values = read("early_stopped")
    return Measured(_mean(values), len(values), missing="no validation summary (runs with a validation split)")


def loss_plateau(read: Read, metric: str) -> Measured:
    values = read("loss_last_change")
    return Measured(
        max(values.values()) if values else None,
        len(values),
        missing="fewer than 2 trained epochs with a finite loss (train_log.csv)",
    )


def _trap(column: str, worst: Callable) -> Callable[[Read, str], Measured]:
    """A proxy-trap diagnostic: its worst value among the cell's runs."""

    def check(read: Read, metric: str) -> Measured:
        values = read(column)
        return Measured(
            worst(values.values()) if values else None,
            len(values),
            missing=f"no {column} (run config eval.proxy_metrics: [trap], a loss with proxies)",
        )

    return check


#: check name -> how it measures; the names are the schema's (workflow/schemas/claims.schema.yaml)
CHECKS: dict[str, Callable[[Read, str], Measured]] = {
    "beats_untrained": beats_untrained,
    "pfml_w2": pfml_w2,
    "rsw_dtp_alpha": rsw_dtp_alpha,
    "asap_alternations": asap_alternations,
    "validation_plateau": validation_plateau,
    "loss_plateau": loss_plateau,
    "proxy_spread": _trap("proxy_spread", min),
    "proxy_zero_grad": _trap("zero_grad_share", max),
    "proxy_step": _trap("step_ratio", min),
}
#: the checks whose pass also needs a paired test (p < ALPHA)
TESTED = ("beats_untrained",)


def expected_text(name: str, low: float | None, high: float | None) -> str:
    """The expected range as the report prints it."""
    if name in TESTED:
        return f"> {low:g}, paired t-test p < {ALPHA:g}"
    if low is not None and high is not None:
        return f"[{low:g}, {high:g}]"
    return f"≥ {low:g}" if low is not None else f"≤ {high:g}"


def passes(name: str, measured: Measured, low: float | None, high: float | None) -> bool:
    value = measured.value
    if value is None:
        return False
    if name in TESTED:
        return value > low and measured.p is not None and measured.p < ALPHA
    return (low is None or value >= low) and (high is None or value <= high)


def run_check(name: str, spec: Mapping[str, Any], read: Read, metric: str) -> dict:
    """One check on one cell and dataset: name, value, expected range (`low`, `high`, `expected`),
    pass, n, p, `detail` (why it failed) and `source` (the catalogue's citation of the range)."""
    has_runs = bool(read("seed"))
    measured = CHECKS[name](read, metric) if has_runs else Measured(None, 0, missing="no runs of this cell")
    low, high = spec.get("low"), spec.get("high")
    ok = passes(name, measured, low, high)
    detail = ""
    if measured.value is None:
        detail = f"not recorded: {measured.missing}"
    elif not ok and name in TESTED:
        detail = (
            f"n = {measured.n}: no paired test"
            if measured.p is None
            else f"{measured.value:+.4g} with p = {measured.p:.3g}, expected {expected_text(name, low, high)}"
        )
    elif not ok:
        detail = f"{measured.value:.4g} outside {expected_text(name, low, high)}"
    return {
        "name": name,
        "value": measured.value,
        "low": low,
        "high": high,
        "expected": expected_text(name, low, high),
        "pass": ok,
        "n": measured.n,
        "p": measured.p,
        "detail": detail,
        "source": spec.get("source", ""),
        "what": spec.get("what", ""),
    }
