"""The faithful miniature's PFML gates (config/claims.yaml) fail on runs that lack the mechanism the claim
rests on and pass on runs that show it (docs/report.md#mechanism-checks): W₂ against δ (supp. eq. 16),
the proxy-trap diagnostics, beats_untrained and convergence on validation on every compared side.
Fabricated per-seed tables."""

import itertools
from pathlib import Path

import pandas as pd
import pytest

from dmlrepro.report.claims import HOLDS, NOT_TESTABLE, evaluate_claim, load_catalogue, load_check_ranges

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "config" / "claims.yaml"
CLAIM = next(c for c in load_catalogue(CATALOGUE) if c["id"] == "pfml-beats-proxy-anchor")
RANGES = load_check_ranges(CATALOGUE)

#: a PFML run that shows the mechanism: W₂ 0.15 < δ (Table 3's 0.16), proxies apart and moving
WORKING = {
    "w2": 0.15,
    "proxy_delta": 0.2,
    "proxy_spread": 1.5,
    "zero_grad_share": 0.1,
    "step_ratio": 0.4,
    "loss_last_change": 0.01,
}


def _tables(pfml=None, pfml_r1=(0.33, 0.34, 0.35), pa_r1=(0.28, 0.29, 0.30), untrained=0.24):
    """pfml_table1 and pfml_table3_w2 (the same runs) with PFML above Proxy Anchor on every dataset of the
    claim's faithful scale."""
    rows = []
    sides = (("pfml", pfml_r1, {**WORKING, **(pfml or {})}), ("proxy_anchor", pa_r1, {}))
    for dataset, (method, values, extra) in itertools.product(CLAIM["scales"]["faithful"]["datasets"], sides):
        for seed, value in enumerate(values):
            rows.append(
                {
                    "method": method,
                    "dataset": dataset,
                    "sweep": "",
                    "seed": seed,
                    "diverged": False,
                    "recall@1": value,
                    "recall@1@untrained": untrained + 0.001 * seed,
                    "loss_last_change": 0.01,
                    "early_stopped": 1.0,
                    **extra,
                }
            )
    table = pd.DataFrame(rows)
    return {"pfml_table1": table, "pfml_table3_w2": table}


def _failing(found):
    return sorted({name.split(" ")[0] for name in found["failing_checks"]})


def test_a_run_with_the_mechanism_passes_every_gate():
    found = evaluate_claim(CLAIM, "faithful", _tables(), RANGES)
    assert found["failing_checks"] == [] and found["verdict"] == HOLDS


@pytest.mark.parametrize(
    "pfml, failing",
    [
        ({"w2": 0.93}, ["pfml_w2"]),  # the faithful miniature's W₂ before clipping: 4.6 δ
        ({"w2": 0.25}, ["pfml_w2"]),  # above δ = 0.2 (supp. eq. 16), within Table 3's order of magnitude
        ({"proxy_spread": 0.6}, ["proxy_spread"]),  # a class's proxies inside one δ clump
        ({"zero_grad_share": 0.75}, ["proxy_zero_grad"]),  # most proxies get no gradient
        ({"step_ratio": 0.07}, ["proxy_step"]),  # Adam's step 15× below the scaling rule's lr·√D
    ],
)
def test_a_pfml_run_whose_proxies_are_trapped_is_not_testable(pfml, failing):
    found = evaluate_claim(CLAIM, "faithful", _tables(pfml), RANGES)
    assert found["test_verdict"] == HOLDS  # the comparison alone would hold ...
    assert found["verdict"] == NOT_TESTABLE and _failing(found) == failing  # ... but does not test the claim


def test_every_compared_side_must_beat_its_untrained_network():
    """PFML under label noise ended below its untrained network: the claim is not testable, whichever side."""
    below = (0.236, 0.238, 0.240)
    for sides in ({"pfml_r1": below}, {"pa_r1": below}):
        found = evaluate_claim(CLAIM, "faithful", _tables(**sides), RANGES)
        assert found["verdict"] == NOT_TESTABLE and _failing(found) == ["beats_untrained"]


def test_a_run_without_the_diagnostics_fails_with_what_would_record_them():
    tables = _tables()
    tables = {k: t.drop(columns=["proxy_spread"]) for k, t in tables.items()}
    found = evaluate_claim(CLAIM, "faithful", tables, RANGES)
    detail = next(c["detail"] for c in found["checks"] if c["name"] == "proxy_spread")
    assert found["verdict"] == NOT_TESTABLE and "eval.proxy_metrics: [trap]" in detail


def test_every_compared_side_must_have_converged_on_validation():
    """A side the epoch cap ended (validation still improving) has not converged: not testable, whichever side."""
    for method in ("pfml", "proxy_anchor"):
        tables = _tables()
        table = tables["pfml_table1"]
        table.loc[(table["method"] == method) & (table["seed"] == 1), "early_stopped"] = 0.0
        found = evaluate_claim(CLAIM, "faithful", tables, RANGES)
        assert found["verdict"] == NOT_TESTABLE and _failing(found) == ["validation_plateau"]
