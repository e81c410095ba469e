"""The verdict vocabulary (docs/report.md#verdicts): "contradicted" only when every condition is met (equal
tuning, every side converged, >= 5 seeds, a sensitivity set that does not change the verdict, every gate
passing), else "not reproduced"; "recipe-sensitive (PFML-R4)" when an alternative of a consequential reading
changes the tests' verdict. Fabricated per-seed tables."""

import copy
from pathlib import Path

import pandas as pd
import pytest

from dmlrepro.report.claims import (
    CONTRADICTED,
    HOLDS,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    RECIPE_SENSITIVE,
    check_claims,
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


#: equal tuning: both sides' final runs after one search budget (experiment "tuned")
TUNED = {
    "reading": "pfml-r22",
    "label": "equal tuning",
    "tuned": True,
    "cells": {"a": {"experiment": "tuned", "method": "ma"}, "b": {"experiment": "tuned", "method": "mb"}},
}


def _claim(**scale):
    cells = {"a": {"experiment": "exp", "method": "ma"}, "b": {"experiment": "exp", "method": "mb"}}
    spec = {
        "datasets": ["synthetic"],
        "cells": cells,
        "checks": [{"check": "validation_plateau"}],
        "sensitivity": [
            {"reading": "pfml-r4", "label": "no clipping", "cells": {"a": {"experiment": "alt", "method": "ma"}}},
            copy.deepcopy(TUNED),
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


def _tables(alt=A_LOW, seeds=5, early_stopped=1.0, tuned=A_LOW):
    return {
        "exp": _table({"ma": A_LOW[:seeds], "mb": B_HIGH[:seeds]}, early_stopped),
        "alt": _table({"ma": alt[:seeds]}),
        "tuned": _table({"ma": tuned, "mb": B_HIGH[: len(tuned)]}),
    }


def test_a_contradiction_with_every_condition_met_is_contradicted():
    found = evaluate_claim(_claim(), "faithful", _tables(), RANGES)
    assert found["test_verdict"] == CONTRADICTED and found["contradiction_unmet"] == []
    assert found["verdict"] == CONTRADICTED


@pytest.mark.parametrize(
    "claim, tables, unmet",
    [
        ({"sensitivity": [_claim()["scales"]["faithful"]["sensitivity"][0]]}, {}, "equal tuning"),  # none declared
        ({}, {"tuned": []}, "equal tuning"),  # declared, not run
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
    alternative, tuned = found["sensitivity"]
    assert tuned["tuned"] and tuned["test_verdict"] == CONTRADICTED
    assert alternative["test_verdict"] == HOLDS and alternative["comparisons"][0]["delta"] == pytest.approx(10.0)
    record = claims_record({"scale": "faithful", "alpha": 0.05, "counts": {}, "claims": [{**_claim(), **found}]})
    assert record["claims"][0]["sensitive_to"] == ["PFML-R4"]
    assert record["claims"][0]["sensitivity"][0]["label"] == "no clipping"


def test_a_failing_gate_outranks_a_flip_which_stays_named():
    """docs/report.md#verdicts: a failing mechanism check makes the claim not testable whatever its tests and
    sensitivity set say (the runs lack the mechanism); the flip is still reported (`sensitive_to`)."""
    found = evaluate_claim(_claim(), "faithful", _tables(alt=[0.70, 0.72, 0.71, 0.73, 0.69], early_stopped=0.0), RANGES)
    assert found["failing_checks"] and found["sensitive_to"] == ["PFML-R4"]
    assert found["verdict"] == NOT_TESTABLE


def test_each_alternative_says_how_many_of_its_runs_stopped_at_their_plateau():
    """A flip read beside whether the alternative's runs converged: per side, the runs early stopping ended
    (early_stopped 1) of all; the chosen cells' count too. Here the chosen runs all hit the cap."""
    found = evaluate_claim(_claim(), "faithful", _tables(early_stopped=0.0), RANGES)
    assert found["at_plateau"] == {"PFML": "0/5", "Proxy Anchor": "0/5"}
    no_clipping, tuned = found["sensitivity"]
    assert no_clipping["at_plateau"] == {"PFML": "5/5", "Proxy Anchor": "0/5"}  # only PFML's cell is replaced
    assert tuned["at_plateau"] == {"PFML": "5/5", "Proxy Anchor": "5/5"}


def test_two_readings_taken_together_are_named_together():
    """PFML-R4's and PFML-R15's alternatives at once: the claim is sensitive to the pair, not to either alone."""
    claim = _claim()
    claim["scales"]["faithful"]["sensitivity"][0]["reading"] = ["pfml-r4", "pfml-r15"]
    found = evaluate_claim(claim, "faithful", _tables(alt=[0.70, 0.72, 0.71, 0.73, 0.69]), RANGES)
    assert found["sensitive_to"] == ["PFML-R4 + PFML-R15"] and found["verdict"] == RECIPE_SENSITIVE
    check_claims([claim], _config(), "faithful")


def test_an_alternative_that_only_loses_significance_is_recipe_sensitive_too():
    overlapping = [0.50, 0.70, 0.55, 0.66, 0.58]
    found = evaluate_claim(_claim(), "faithful", _tables(alt=overlapping), RANGES)
    assert found["sensitivity"][0]["test_verdict"] == "inconclusive" and found["verdict"] == RECIPE_SENSITIVE


@pytest.mark.parametrize(
    "alternative, message",
    [
        ({"reading": "PFML-R4"}, r"'PFML-R4' is not a reading id"),
        ({"reading": ["pfml-r4", "r15"]}, r"'r15' is not a reading id"),
        ({"cells": {"c": {"experiment": "exp", "method": "ma"}}}, r"'c' has no cell at scale faithful"),
        ({"cells": {"a": {"experiment": "nowhere", "method": "ma"}}}, r"sensitivity\[0\]\.cells\.a\.experiment"),
    ],
)
def test_check_claims_names_a_bad_sensitivity_entry(alternative, message):
    claim = _claim()
    claim["scales"]["faithful"]["sensitivity"][0].update(alternative)
    check_claims([_claim()], _config(), "faithful")  # the good one passes
    with pytest.raises(ValueError, match=message):
        check_claims([claim], _config(), "faithful")


def _config(**tuned):
    experiment = {"methods": ["ma", "mb"], "datasets": ["synthetic"], "metrics": ["recall@1"]}
    search = {"space": {}, "method_space": {"ma": {"x": {}}, "mb": {"y": {}}}, "trials": 12, "folds": [0]}
    return {
        "experiments": {
            "exp": experiment,
            "alt": experiment,
            "tuned": {**experiment, "search": search, "final": {"seeds": [0, 1, 2, 3, 4]}, **tuned},
            "tuned_longer": {**experiment, "search": {**search, "trials": 24}, "final": {"seeds": [0]}},
        }
    }


ONE_SIDE = {"b": {"experiment": "tuned", "method": "mb"}}
UNEQUAL = {"a": {"experiment": "tuned", "method": "ma"}, "b": {"experiment": "tuned_longer", "method": "mb"}}
NO_SPACE_B = {"search": {"space": {}, "method_space": {"ma": {"x": {}}}, "trials": 12, "folds": [0]}}


@pytest.mark.parametrize(
    "cells, config, message",
    [
        (ONE_SIDE, {}, r"names every side \(\[.a., .b.\]\), not \[.b.\]"),
        (None, {"search": None}, r"experiment tuned has no search and final stage"),
        (None, {"final": None}, r"experiment tuned has no search and final stage"),
        (None, NO_SPACE_B, "searches nothing of mb"),
        (UNEQUAL, {}, r"differ in budget \(trials, folds\)"),
    ],
)
def test_check_claims_refuses_a_tuned_alternative_without_equal_budgets(cells, config, message):
    """Equal tuning is checked, not declared: every side searched, with one budget."""
    claim = _claim()
    if cells is not None:
        claim["scales"]["faithful"]["sensitivity"][1]["cells"] = cells
    with pytest.raises(ValueError, match=message):
        check_claims([claim], _config(**config), "faithful")


def test_a_claim_whose_cells_have_no_runs_is_not_run_whatever_its_gates():
    """An experiment the workflow did not build (opt-in, a staged run) leaves its claims "not run at this
    scale", not "not testable" from gates that find no runs."""
    claim = _claim(checks=[{"check": "beats_untrained", "metric": "recall@1"}, {"check": "validation_plateau"}])
    found = evaluate_claim(claim, "faithful", {"alt": _table({"ma": A_LOW})}, RANGES)
    assert found["verdict"] is None and found["test_verdict"] is None and found["checks"] == []
    assert (
        claims_record({"scale": "faithful", "alpha": 0.05, "counts": {}, "claims": [{**claim, **found}]})["claims"][0][
            "verdict"
        ]
        == "not run at this scale"
    )
