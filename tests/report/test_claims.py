"""The Claims section's statistics and catalogue: Welch's and the paired t-test against scipy and a
float64 hand computation, the verdict rule (docs/report.md#claims), cells read from per-seed tables,
three fabricated claims built to hold, to fail and to be inconclusive, and the repository's
catalogue checked against both configs and the papers' printed numbers."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from dmlrepro.report.aggregate import aggregate_runs, seed_table
from dmlrepro.report.claims import (
    CONTRADICTED,
    HOLDS,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    TTest,
    cell_values,
    check_claims,
    claim_verdict,
    comparison_verdict,
    evaluate_claim,
    load_catalogue,
    paired_test,
    read_catalogue,
    reported_numbers,
    welch_test,
)

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "config" / "claims.yaml"
REPORTED = ROOT / "config" / "reported"

SAMPLES = [
    ([71.2, 73.9, 72.5], [69.8, 70.4, 68.1]),
    ([0.61, 0.58, 0.66, 0.63, 0.60], [0.55, 0.57]),  # unequal n
    ([10.0, 10.5, 9.0, 12.0], [10.2, 9.8, 10.1, 10.0, 9.9, 10.3]),  # unequal spread, small Δ
    ([5.0, 5.0, 5.1], [7.0, 9.0, 4.0]),
]


def hand_welch(a, b):
    """Welch's t and ν written out in float64 from the definitions (sample variance, ddof 1)."""
    na, nb = float(len(a)), float(len(b))
    ma, mb = math.fsum(a) / na, math.fsum(b) / nb
    va = math.fsum((x - ma) ** 2 for x in a) / (na - 1.0)
    vb = math.fsum((x - mb) ** 2 for x in b) / (nb - 1.0)
    se2 = va / na + vb / nb
    t = (ma - mb) / math.sqrt(se2)
    df = se2 * se2 / ((va / na) ** 2 / (na - 1.0) + (vb / nb) ** 2 / (nb - 1.0))
    return t, df


@pytest.mark.parametrize("a, b", SAMPLES)
def test_welch_matches_scipy_and_hand_computation(a, b):
    found = welch_test(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    t, df = hand_welch(a, b)
    assert found.t == pytest.approx(ref.statistic, rel=1e-12)
    assert found.p == pytest.approx(ref.pvalue, rel=1e-10)
    assert found.t == pytest.approx(t, rel=1e-12)
    assert found.df == pytest.approx(df, rel=1e-12)
    assert found.p == pytest.approx(2.0 * stats.t.sf(abs(t), df), rel=1e-10)


def test_welch_df_of_a_textbook_case():
    # equal n and equal variances: ν = 2(n − 1) exactly, and t = Δ / √(2 s² / n)
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
    found = welch_test(a, b)
    assert found.df == pytest.approx(4.0, rel=1e-14)
    assert found.t == pytest.approx(-3.0 / math.sqrt(2.0 / 3.0), rel=1e-14)


def test_paired_matches_scipy():
    a = {9: 10.0, 0: 71.2, 1: 73.9, 2: 72.5, 3: 70.0}  # seeds 9 and 7 have no partner: left out
    b = {0: 69.8, 1: 73.0, 7: 50.0, 2: 70.1, 3: 69.9}
    found = paired_test(a, b)
    ref = stats.ttest_rel([a[k] for k in range(4)], [b[k] for k in range(4)])
    assert found.t == pytest.approx(ref.statistic, rel=1e-12)
    assert found.p == pytest.approx(ref.pvalue, rel=1e-10)
    assert found.df == 3.0


def test_no_test_without_spread():
    assert welch_test([1.0], [2.0, 3.0]) is None  # n < 2 on a side
    assert welch_test([1.0, 1.0], [2.0, 2.0]) is None  # no variation: t undefined
    assert paired_test({0: 1.0}, {0: 2.0}) is None
    assert paired_test({0: 1.0, 1: 2.0}, {0: 2.0, 1: 3.0}) is None  # constant differences


def test_comparison_verdict_rule():
    significant, weak = TTest(3.0, 4.0, 0.01), TTest(1.0, 4.0, 0.30)
    assert comparison_verdict(+1.5, significant, sign=+1) == HOLDS
    assert comparison_verdict(-1.5, significant, sign=+1) == CONTRADICTED
    assert comparison_verdict(-1.5, significant, sign=-1) == HOLDS  # lower is better
    assert comparison_verdict(+1.5, weak, sign=+1) == INCONCLUSIVE
    assert comparison_verdict(+1.5, None, sign=+1) == INCONCLUSIVE
    # Bonferroni for a contradiction among k comparisons: p = 0.03 holds but does not contradict at k = 2
    borderline = TTest(2.5, 4.0, 0.03)
    assert comparison_verdict(+1.0, borderline, sign=+1, k=2) == HOLDS
    assert comparison_verdict(-1.0, borderline, sign=+1, k=2) == INCONCLUSIVE
    assert comparison_verdict(-1.0, borderline, sign=+1, k=1) == CONTRADICTED


def test_claim_verdict_combines_comparisons():
    assert claim_verdict([HOLDS, HOLDS]) == HOLDS
    assert claim_verdict([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE
    assert claim_verdict([HOLDS, CONTRADICTED, INCONCLUSIVE]) == CONTRADICTED
    assert claim_verdict([]) is None


# ---- fabricated run tables ----------------------------------------------------------------------


def _table(cells):
    """A per-seed table (aggregate.seed_table's columns) from {(method, sweep): [values per seed]}."""
    rows = [
        {"method": m, "dataset": "synthetic", "sweep": sweep, "seed": seed, "diverged": False, "recall@1": v}
        for (m, sweep), values in cells.items()
        for seed, v in enumerate(values)
    ]
    return pd.DataFrame(rows)


def _claim(better="a", worse="b", **extra):
    cells = {"a": {"experiment": "exp", "method": "ma"}, "b": {"experiment": "exp", "method": "mb"}}
    return {
        "id": "x",
        "paper": "PFML",
        "source": "Table 1",
        "quote": "q",
        "claim": "a > b",
        "metrics": ["recall@1"],
        "sides": {"a": "A", "b": "B"},
        "better": [better],
        "worse": [worse],
        "scales": {"miniature": {"datasets": ["synthetic"], "cells": cells}},
        **extra,
    }


def test_claim_built_to_hold():
    tables = {"exp": _table({("ma", ""): [0.72, 0.74, 0.73], ("mb", ""): [0.60, 0.62, 0.61]})}
    found = evaluate_claim(_claim(), "miniature", tables)
    assert found["verdict"] == HOLDS
    row = found["comparisons"][0]
    assert row["a"] == {"n": 3, "mean": pytest.approx(73.0), "std": pytest.approx(1.0)}  # paper units: %
    assert row["delta"] == pytest.approx(12.0)
    assert row["p"] == pytest.approx(stats.ttest_ind([72, 74, 73], [60, 62, 61], equal_var=False).pvalue)


def test_claim_built_to_fail():
    tables = {"exp": _table({("ma", ""): [0.50, 0.52, 0.51], ("mb", ""): [0.60, 0.62, 0.61]})}
    found = evaluate_claim(_claim(), "miniature", tables)
    assert found["test_verdict"] == CONTRADICTED
    # three seeds, no tuning, no convergence check, no sensitivity set: not earned, so "not reproduced"
    assert found["verdict"] == NOT_REPRODUCED and len(found["contradiction_unmet"]) == 4


def test_claims_built_to_be_inconclusive():
    overlapping = {"exp": _table({("ma", ""): [0.60, 0.70, 0.50], ("mb", ""): [0.58, 0.66, 0.55]})}
    assert evaluate_claim(_claim(), "miniature", overlapping)["test_verdict"] == INCONCLUSIVE
    one_seed = {"exp": _table({("ma", ""): [0.90], ("mb", ""): [0.10]})}  # a huge Δ, but no spread to test
    found = evaluate_claim(_claim(), "miniature", one_seed)
    assert found["test_verdict"] == INCONCLUSIVE
    assert "n < 2" in found["comparisons"][0]["reason"]


def test_lower_is_better_flips_the_direction():
    tables = {"exp": _table({("ma", ""): [0.16, 0.15, 0.17], ("mb", ""): [0.36, 0.38, 0.37]})}
    assert evaluate_claim(_claim(lower_is_better=True), "miniature", tables)["verdict"] == HOLDS
    assert evaluate_claim(_claim(), "miniature", tables)["test_verdict"] == CONTRADICTED


def test_ordering_claim_is_every_pair():
    # "a is best": a > b and a > c; c beats a -> contradicted even though a beats b
    tables = {
        "exp": _table({("ma", ""): [0.70, 0.71, 0.72], ("mb", ""): [0.50, 0.51, 0.52], ("mc", ""): [0.90, 0.91, 0.92]})
    }
    claim = _claim()
    claim["sides"]["c"] = "C"
    claim["worse"] = ["b", "c"]
    claim["scales"]["miniature"]["cells"]["c"] = {"experiment": "exp", "method": "mc"}
    found = evaluate_claim(claim, "miniature", tables)
    assert [r["verdict"] for r in found["comparisons"]] == [HOLDS, CONTRADICTED]
    assert found["test_verdict"] == CONTRADICTED


def test_paired_claim_uses_common_seeds():
    # a small, steady gain per seed over a large seed-to-seed spread: only the paired test sees it
    base = [0.50, 0.70, 0.60, 0.80]
    tables = {"exp": _table({("ma", ""): [v + 0.01 + 0.001 * i for i, v in enumerate(base)], ("mb", ""): base})}
    assert evaluate_claim(_claim(), "miniature", tables)["test_verdict"] == INCONCLUSIVE
    assert evaluate_claim(_claim(test="paired"), "miniature", tables)["verdict"] == HOLDS


def test_cells_without_runs_are_inconclusive():
    found = evaluate_claim(_claim(), "miniature", {"exp": _table({("ma", ""): [0.5, 0.6]})})
    assert found["test_verdict"] == INCONCLUSIVE
    assert found["comparisons"][0]["b"] == {"n": 0, "mean": None, "std": None}
    assert "no finite value" in found["comparisons"][0]["reason"]


def test_a_scale_without_cells_is_not_run():
    found = evaluate_claim(_claim(), "paper", {})
    assert found == {
        "comparisons": [],
        "test_verdict": None,
        "p": None,
        "checks": [],
        "failing_checks": [],
        "sensitivity": [],
        "at_plateau": {},
        "sensitive_to": [],
        "contradiction_unmet": [],
        "verdict": None,
    }


def test_cell_values_match_sweep_points_and_skip_nan():
    table = pd.DataFrame(
        [
            {"method": "pfml", "dataset": "synthetic", "sweep": "loss.hparams.alpha=4.0", "seed": 0, "recall@1": 0.5},
            {
                "method": "pfml",
                "dataset": "synthetic",
                "sweep": "loss.hparams.alpha=4.0",
                "seed": 1,
                "recall@1": float("nan"),
            },
            {"method": "pfml", "dataset": "synthetic", "sweep": "loss.hparams.alpha=0.0", "seed": 0, "recall@1": 0.9},
            {"method": "pfml", "dataset": "other", "sweep": "loss.hparams.alpha=4.0", "seed": 2, "recall@1": 0.1},
        ]
    )
    cell = {"experiment": ["e1", "e2"], "method": "pfml", "sweep": {"loss.hparams.alpha": 4}}
    # a run listed by two experiments counts once
    assert cell_values({"e1": table, "e2": table}, cell, "synthetic", "recall@1") == {0: 0.5}
    assert cell_values({}, cell, "synthetic", "recall@1") == {}


def test_seed_table_holds_the_values_behind_the_means():
    records = [
        {
            "method": "m",
            "dataset": "d",
            "sweep": {"k": 1},
            "seed": s,
            "result": {"status": "completed", "metrics": {"recall@1": v}},
        }
        for s, v in enumerate([0.1, 0.2, 0.6])
    ]
    records.append(
        {
            "method": "m",
            "dataset": "d",
            "sweep": {"k": 1},
            "seed": 3,
            "result": {"status": "diverged", "metrics": {"recall@1": 0.9}},
        }
    )
    seeds = seed_table(records, ["recall@1"])
    assert list(seeds["seed"]) == [0, 1, 2, 3] and seeds["recall@1"].isna().tolist() == [False, False, False, True]
    means = aggregate_runs(records, ["recall@1"])
    assert means["recall@1_mean"].iloc[0] == pytest.approx(np.nanmean(seeds["recall@1"]))
    assert means["seeds"].iloc[0] == 4 and means["diverged"].iloc[0] == 1


# ---- the repository's catalogue ---------------------------------------------------------------------


def _config(name):
    return yaml.safe_load((ROOT / "config" / name).read_text())


@pytest.mark.parametrize(
    "config, scale", [("config.yaml", "miniature"), ("miniature.yaml", "faithful"), ("paper.yaml", "paper")]
)
def test_catalogue_matches_the_configs(config, scale):
    from snakemake.utils import validate

    claims = load_catalogue(CATALOGUE)
    validate(read_catalogue(CATALOGUE), str(ROOT / "workflow" / "schemas" / "claims.schema.yaml"))
    loaded = _config(config)
    assert loaded["claims"] == {"catalogue": "config/claims.yaml", "scale": scale}
    check_claims(claims, loaded, scale)


def test_catalogue_holds_the_issue_claims():
    ids = {c["id"] for c in load_catalogue(CATALOGUE)}
    assert {
        "pfml-beats-proxy-anchor",
        "pfml-beats-cpml",
        "pfml-proxies-help",
        "pfml-no-decay-worst",
        "pfml-strong-decay-better",
        "pfml-label-noise",
        "rsw-warp-beats-eq4",
        "asap-beats-base-loss",
    } <= ids
    assert all(c["scales"].get("miniature") for c in load_catalogue(CATALOGUE))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["scales"]["miniature"]["cells"]["pfml"].update(experiment="nope"), "not an experiment"),
        (lambda c: c["scales"]["miniature"]["cells"]["pfml"].update(method="nope"), "not a method"),
        (lambda c: c.update(metrics=["recall@1000"]), "has no metric"),
        (lambda c: c.update(worse=["nope"]), "not one of sides"),
    ],
)
def test_check_claims_names_the_bad_key(mutate, message):
    claim = load_catalogue(CATALOGUE)[0]
    mutate(claim)
    with pytest.raises(ValueError, match=message):
        check_claims([claim], _config("config.yaml"), "miniature")


def test_check_claims_wants_the_sweep_point():
    claim = next(c for c in load_catalogue(CATALOGUE) if c["id"] == "pfml-no-decay-worst")
    claim["scales"]["miniature"]["cells"]["a0"] = {"experiment": "pfml_fig3c_alpha", "method": "pfml"}
    with pytest.raises(ValueError, match="name the point"):
        check_claims([claim], _config("config.yaml"), "miniature")
    claim["scales"]["miniature"]["cells"]["a0"]["sweep"] = {"loss.hparams.alpha": 5.0}
    with pytest.raises(ValueError, match="not a sweep point"):
        check_claims([claim], _config("config.yaml"), "miniature")


def test_reported_numbers_are_the_papers():
    claims = {c["id"]: c for c in load_catalogue(CATALOGUE)}
    # PFML Table 1, ResNet50 (512 dim), CUB-200-2011 R@1: Potential Field (Ours) 73.4 ± 0.3, Proxy Anchor 69.7
    cub = reported_numbers(claims["pfml-beats-proxy-anchor"], REPORTED)[0]
    assert cub["dataset"] == "CUB-200-2011"
    assert [(v["label"], v["text"], v["std"]) for v in cub["values"]] == [
        ("PFML", "73.4", 0.3),
        ("Proxy Anchor", "69.7", None),
    ]
    # ASAP Sec. 5.2: 98.06 % MAP@R sample-based vs 97.21 % proxy-based
    mnist = reported_numbers(claims["asap-samples-beat-proxies"], REPORTED)[0]
    assert [v["text"] for v in mnist["values"]] == ["98.06", "97.21"]
    # every claim that names printed numbers finds each named row on some printed dataset
    for claim in claims.values():
        if claim.get("reported"):
            found = {v["side"] for d in reported_numbers(claim, REPORTED) for v in d["values"]}
            assert found == set(claim["reported"]["methods"]), claim["id"]


def test_docs_list_every_claim():
    docs = (ROOT / "docs" / "report.md").read_text()
    for claim in load_catalogue(CATALOGUE):
        assert f"| `{claim['id']}` | {claim['paper']} | {claim['source']} |" in docs, claim["id"]
