"""The verdict vocabulary (docs/report.md#verdicts): "contradicted" only when every condition is met (equal
tuning, every side converged, >= 5 seeds, a sensitivity set that does not change the verdict, every gate
passing), else "not reproduced"; "recipe-sensitive (PFML-R4)" when an alternative of a consequential reading
changes the tests' verdict. Fabricated per-seed tables."""

from pathlib import Path

import pandas as pd
import pytest

from dmlrepro.report.claims import (
    CONTRADICTED,
    HOLDS,
    NOT_REPRODUCED,
    RECIPE_SENSITIVE,
    claims_record,
    evaluate_claim,
    load_check_ranges,
)

RANGES = load_check_ranges(Path(__file__).resolve().parents[2] / "config" / "claims.yaml")
A_LOW = [0.50, 0.52, 0.51, 0.53, 0.49]  # PFML below Proxy Anchor on five seeds: the tests contradict
B_HIGH = [0.60, 0.62, 0.61, 0.63, 0.59]


def _table(cells, early_stopped=1.0):
    rows = [
        {"method": m, "dataset": "synthetic", "sweep": "", "seed": seed, "diverged": False, "recall@1": v}
        | {"early_stopped": early_stopped}
        for m, values in cells.items()
        for seed, v in enumerate(values)
    ]
    return pd.DataFrame(rows)


def _claim(**scale):
    cells = {"a": {"experiment": "exp", "method": "ma"}, "b": {"experiment": "exp", "method": "mb"}}
    spec = {
        "datasets": ["synthetic"],
        "cells": cells,
        "checks": [{"check": "validation_plateau"}],
        "equal_tuning": True,
        "sensitivity": [
            {"reading": "pfml-r4", "label": "no clipping", "cells": {"a": {"experiment": "alt", "method": "ma"}}}
        ],
    }
    spec.update(scale)
    return {
        "id": "x",
        "paper": "PFML",
        "source": "Table 1",
        "quote": "q",
        "claim": "a > b",
        "metrics": ["recall@1"],
        "sides": {"a": "PFML", "b": "Proxy Anchor"},
        "better": ["a"],
        "worse": ["b"],
        "scales": {"faithful": spec},
    }


def _tables(alt=A_LOW, seeds=5, early_stopped=1.0):
    return {
        "exp": _table({"ma": A_LOW[:seeds], "mb": B_HIGH[:seeds]}, early_stopped),
        "alt": _table({"ma": alt[:seeds]}),
    }


def test_a_contradiction_with_every_condition_met_is_contradicted():
    found = evaluate_claim(_claim(), "faithful", _tables(), RANGES)
    assert found["test_verdict"] == CONTRADICTED and found["contradiction_unmet"] == []
    assert found["verdict"] == CONTRADICTED


@pytest.mark.parametrize(
    "claim, tables, unmet",
    [
        ({"equal_tuning": False}, {}, "equal tuning"),
        ({}, {"early_stopped": 0.0}, "every side converged"),  # the cap ended the runs
        ({"checks": []}, {}, "every side converged"),  # nothing checked it
        ({}, {"seeds": 3}, ">= 5 seeds (3)"),
        ({"sensitivity": []}, {}, "a sensitivity set"),
        ({}, {"alt": []}, "a sensitivity set"),  # an alternative without runs
    ],
)
def test_a_contradiction_missing_one_condition_is_not_reproduced(claim, tables, unmet):
    found = evaluate_claim(_claim(**claim), "faithful", _tables(**tables), RANGES)
    assert found["test_verdict"] == CONTRADICTED
    assert found["verdict"] in (NOT_REPRODUCED, "not testable at this scale")
    assert any(u.startswith(unmet) for u in found["contradiction_unmet"]), found["contradiction_unmet"]


def test_an_alternative_that_changes_the_verdict_makes_the_claim_recipe_sensitive():
    """PFML with clipping below Proxy Anchor, without clipping above it: the reading decides."""
    alt_high = [0.70, 0.72, 0.71, 0.73, 0.69]
    found = evaluate_claim(_claim(), "faithful", _tables(alt=alt_high), RANGES)
    assert found["verdict"] == RECIPE_SENSITIVE and found["sensitive_to"] == ["PFML-R4"]
    (alternative,) = found["sensitivity"]
    assert alternative["test_verdict"] == HOLDS and alternative["comparisons"][0]["delta"] == pytest.approx(10.0)
    record = claims_record({"scale": "faithful", "alpha": 0.05, "counts": {}, "claims": [{**_claim(), **found}]})
    assert record["claims"][0]["sensitive_to"] == ["PFML-R4"]
    assert record["claims"][0]["sensitivity"][0]["label"] == "no clipping"


def test_an_alternative_that_only_loses_significance_is_recipe_sensitive_too():
    overlapping = [0.50, 0.70, 0.55, 0.66, 0.58]
    found = evaluate_claim(_claim(), "faithful", _tables(alt=overlapping), RANGES)
    assert found["sensitivity"][0]["test_verdict"] == "inconclusive" and found["verdict"] == RECIPE_SENSITIVE


@pytest.mark.parametrize(
    "alternative, message",
    [
        ({"reading": "PFML-R4"}, r"'PFML-R4' is not a reading id"),
        ({"cells": {"c": {"experiment": "exp", "method": "ma"}}}, r"'c' has no cell at scale faithful"),
        ({"cells": {"a": {"experiment": "nowhere", "method": "ma"}}}, r"sensitivity\[0\]\.cells\.a\.experiment"),
    ],
)
def test_check_claims_names_a_bad_sensitivity_entry(alternative, message):
    from dmlrepro.report.claims import check_claims

    claim = _claim()
    claim["scales"]["faithful"]["sensitivity"][0].update(alternative)
    config = {
        "experiments": {
            name: {"methods": ["ma", "mb"], "datasets": ["synthetic"], "metrics": ["recall@1"]}
            for name in ("exp", "alt")
        }
    }
    check_claims([_claim()], config, "faithful")  # the good one passes
    with pytest.raises(ValueError, match=message):
        check_claims([claim], config, "faithful")
