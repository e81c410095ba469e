"""The mechanism checks that gate the Claims section's verdicts (report.mechanisms, docs/report.md#mechanism-checks):
their inputs as rule aggregate writes them (untrained metrics, the loss's last-epoch move, an RSW run's
final α, ASAP's alternations, MLRC reproductions), each check's pass rule on fabricated per-seed
tables, the gate on a claim's verdict, and the catalogue's checks against the schema and the code."""

import copy
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml
from scipy import stats

from dmlrepro.report.aggregate import (
    final_rsw_alpha,
    loss_last_change,
    mlrc_records,
    run_mechanism,
    seed_table,
    untrained_column,
)
from dmlrepro.report.claims import (
    CONTRADICTED,
    HOLDS,
    NOT_TESTABLE,
    check_claims,
    evaluate_claim,
    load_check_ranges,
    read_catalogue,
)
from dmlrepro.report.mechanisms import CHECKS, run_check

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "config" / "claims.yaml"
SCHEMA = ROOT / "workflow" / "schemas" / "claims.schema.yaml"
RANGES = load_check_ranges(CATALOGUE)


# ---- the inputs, as rule aggregate writes them ----------------------------------------------------------


def _log(tmp_path, losses):
    path = tmp_path / "train_log.csv"
    rows = ["epoch,phase,steps,loss,seconds,test_recall@1", "0,1,0,,0.0,0.2"]
    rows += [f"{e},1,10,{loss},1.0," for e, loss in enumerate(losses, start=1)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_loss_last_change_is_the_last_epochs_share_of_the_range(tmp_path):
    # 4.0 -> 2.0 -> 1.2 -> 1.1: the last epoch moved 0.1 of a 2.9 range
    assert loss_last_change(_log(tmp_path, [4.0, 2.0, 1.2, 1.1])) == pytest.approx(0.1 / 2.9)
    assert loss_last_change(_log(tmp_path, [4.0, 3.0, 2.0, 1.0])) == pytest.approx(1.0 / 3.0)  # still falling
    assert loss_last_change(_log(tmp_path, [1.5, 1.5])) == 0.0
    assert loss_last_change(_log(tmp_path, [2.0, "nan"])) is None  # one finite epoch: no move to measure


def test_final_rsw_alpha_is_the_last_phases():
    warp = {"loss": {"name": "rsw", "hparams": {"alpha": 28.4, "k1": 0.93}}}
    assert final_rsw_alpha(warp) == 28.4
    assert final_rsw_alpha({**warp, "followup": {"epochs": 2, "loss": {"alpha": 24.68}}}) == 24.68
    assert final_rsw_alpha({**warp, "followup": {"epochs": 0, "loss": {"alpha": 24.68}}}) == 28.4
    assert final_rsw_alpha({"loss": {"name": "rsw", "hparams": {"warp": False}}}) is None  # eq. 4
    assert final_rsw_alpha({"loss": {"name": "rsw", "hparams": {"alpha": float("inf")}}}) is None  # V5, V6
    assert final_rsw_alpha({"loss": {"name": "rsw", "hparams": {"function": "power", "power": 2.0}}}) is None
    assert final_rsw_alpha({"loss": {"name": "pfml", "hparams": {"alpha": 4.0}}}) is None  # PFML's α decays


def test_run_mechanism_reads_the_validation_summary(tmp_path):
    result = {"status": "completed", "validation": {"alternations": 3, "early_stopped": True}}
    found = run_mechanism(result, _log(tmp_path, [2.0, 1.0, 0.98]), {"loss": {"name": "pair_c2"}})
    assert found == {"alternations": 3.0, "early_stopped": 1.0, "loss_last_change": pytest.approx(0.02 / 1.02)}
    assert "loss_last_change" not in run_mechanism({"status": "diverged"}, _log(tmp_path, [2.0, 1.0]), {})


def test_the_w2_bound_falls_back_to_the_configured_delta(tmp_path):
    """A metrics.json evaluated before `proxy_delta` was recorded: the run config's δ (PFML, CPML) stands in;
    the recorded δ wins where both are there."""
    log = _log(tmp_path, [2.0, 1.0])
    pfml = {"loss": {"name": "pfml", "hparams": {"delta": 0.3, "alpha": 4.0}}}
    assert run_mechanism({"status": "completed"}, log, pfml)["proxy_delta"] == 0.3
    assert "proxy_delta" not in run_mechanism({"status": "completed"}, log, {"loss": {"name": "pfml", "hparams": {}}})
    assert "proxy_delta" not in run_mechanism(
        {"status": "completed"}, log, {"loss": {"name": "rsw", "hparams": {"delta": 1}}}
    )
    record = {"method": "pfml", "dataset": "d", "sweep": {}, "seed": 0, "mechanism": {"proxy_delta": 0.3}}
    older = seed_table([{**record, "result": {"status": "completed", "proxy_metrics": {"w2": 0.25}}}], ["recall@1"])
    recorded = {"status": "completed", "proxy_metrics": {"w2": 0.25, "proxy_delta": 0.2}}
    newer = seed_table([{**record, "result": recorded}], ["recall@1"])
    assert older["proxy_delta"].tolist() == [0.3] and newer["proxy_delta"].tolist() == [0.2]


def test_seed_table_carries_untrained_values_and_mechanism_inputs():
    records = [
        {
            "method": "m",
            "dataset": "d",
            "sweep": {},
            "seed": s,
            "result": {
                "status": status,
                "metrics": {"recall@1": 0.5},
                "untrained_metrics": {"recall@1": 0.2},
                "proxy_metrics": {"w2": 0.3},
            },
            "mechanism": {"loss_last_change": 0.01, "alternations": 4.0},
        }
        for s, status in enumerate(["completed", "diverged"])
    ]
    table = seed_table(records, ["recall@1"])
    assert list(table.columns) == [
        "method",
        "dataset",
        "sweep",
        "seed",
        "diverged",
        "recall@1",
        "recall@1@untrained",
        "alternations",
        "early_stopped",
        "loss_last_change",
        "rsw_alpha",
        "w2",
        "proxy_delta",
        "avg_dtp",
        "proxy_spread",
        "zero_grad_share",
        "step_ratio",
    ]
    first, diverged = table.to_dict("records")
    assert first["recall@1@untrained"] == 0.2 and first["w2"] == 0.3 and first["alternations"] == 4.0
    # a diverged run: its metrics and proxy metrics are hidden, its evaluation before training is not
    assert pd.isna(diverged["recall@1"]) and pd.isna(diverged["w2"]) and diverged["recall@1@untrained"] == 0.2


def test_an_mlrc_reproduction_combines_its_folds(tmp_path):
    import numpy as np

    from dmlrepro.evaluation import save_embeddings

    records = []
    for fold, (alternations, move, before) in enumerate([(4, 0.01, 0.10), (2, 0.03, 0.20)]):
        folder = tmp_path / f"f{fold}"
        folder.mkdir()
        labels = np.repeat(np.arange(3), 3)
        save_embeddings(
            folder / "embeddings_test.npz", np.eye(9, 4, dtype=np.float32) + labels[:, None], labels, np.arange(9)
        )
        records.append(
            {
                "method": "m",
                "dataset": "d",
                "seed": 0,
                "dir": str(folder),
                "sweep": {"validation.fold": fold},
                "result": {
                    "status": "completed",
                    "ks": [1],
                    "metrics": {"map@r": 0.5},
                    "untrained_metrics": {"map@r": before},
                },
                "mechanism": {"alternations": float(alternations), "early_stopped": 1.0, "loss_last_change": move},
            }
        )
    (out,) = mlrc_records(records)
    assert out["result"]["untrained_metrics"] == {"map@r@separated": pytest.approx(0.15)}  # the folds' mean
    # every fold must alternate and plateau: the fewest alternations, the largest move
    assert out["mechanism"] == {"alternations": 2.0, "early_stopped": 1.0, "loss_last_change": 0.03}


# ---- each check on a fabricated per-seed table ------------------------------------------------------------


def _reader(**columns):
    """read(column) over one cell: seed -> value; `seed` lists the cell's runs."""
    seeds = {s: float(s) for values in columns.values() for s in range(len(values))}
    columns = {"seed": seeds, **{k: {s: v for s, v in enumerate(vals) if v is not None} for k, vals in columns.items()}}
    return lambda column: columns.get(column, {})


def test_beats_untrained_is_a_paired_test_of_the_gain():
    after, before = [0.33, 0.30, 0.36], [0.20, 0.21, 0.19]
    found = run_check(
        "beats_untrained",
        RANGES["beats_untrained"],
        _reader(**{"recall@1": after, untrained_column("recall@1"): before}),
        "recall@1",
    )
    assert found["value"] == pytest.approx(13.0) and found["n"] == 3  # points (paper units)
    assert found["p"] == pytest.approx(stats.ttest_rel([33, 30, 36], [20, 21, 19]).pvalue) and found["pass"]
    damaged = run_check(
        "beats_untrained",
        RANGES["beats_untrained"],
        _reader(**{"recall@1": before, untrained_column("recall@1"): after}),
        "recall@1",
    )
    assert damaged["value"] == pytest.approx(-13.0) and not damaged["pass"]
    one_seed = run_check(
        "beats_untrained",
        RANGES["beats_untrained"],
        _reader(**{"recall@1": [0.9], untrained_column("recall@1"): [0.1]}),
        "recall@1",
    )
    assert not one_seed["pass"] and "no paired test" in one_seed["detail"]
    unrecorded = run_check("beats_untrained", RANGES["beats_untrained"], _reader(**{"recall@1": after}), "recall@1")
    assert unrecorded["value"] is None and "eval.before_training" in unrecorded["detail"]


@pytest.mark.parametrize(
    "name, column, values, value, ok",
    [
        ("asap_alternations", "alternations", [5, 3, 4], 3, True),
        ("asap_alternations", "alternations", [5, 1, 4], 1, False),  # the run that barely alternates decides
        ("validation_plateau", "early_stopped", [1, 1], 1.0, True),
        ("validation_plateau", "early_stopped", [1, 0], 0.5, False),  # one run ended on the epoch cap
        ("loss_plateau", "loss_last_change", [0.01, 0.04], 0.04, True),
        ("loss_plateau", "loss_last_change", [0.01, 0.2], 0.2, False),
    ],
)
def test_range_checks(name, column, values, value, ok):
    found = run_check(name, RANGES[name], _reader(**{column: values}), "recall@1")
    assert found["value"] == pytest.approx(value) and found["pass"] is ok
    assert (found["detail"] == "") is ok


def test_pfml_w2_is_measured_against_each_runs_own_delta():
    # PFML Table 3: W₂ 0.16 at δ = 0.2 (supp. eq. 16: W₂ ≤ δ)
    table3 = run_check("pfml_w2", RANGES["pfml_w2"], _reader(w2=[0.15, 0.17], proxy_delta=[0.2, 0.2]), "recall@1")
    assert table3["value"] == pytest.approx(0.8) and table3["pass"] and table3["detail"] == ""
    left = run_check("pfml_w2", RANGES["pfml_w2"], _reader(w2=[5.8, 5.8], proxy_delta=[0.2, 0.2]), "recall@1")
    assert left["value"] == pytest.approx(29.0) and not left["pass"]  # the proxies left the data
    # the same W₂ 0.25: above δ = 0.2, within a δ = 0.3 changed in the recipe (Fig. 3b's range)
    wider = run_check("pfml_w2", RANGES["pfml_w2"], _reader(w2=[0.25], proxy_delta=[0.3]), "recall@1")
    narrower = run_check("pfml_w2", RANGES["pfml_w2"], _reader(w2=[0.25], proxy_delta=[0.2]), "recall@1")
    assert wider["pass"] and not narrower["pass"]
    unrecorded = run_check("pfml_w2", RANGES["pfml_w2"], _reader(w2=[0.15]), "recall@1")
    assert not unrecorded["pass"] and "proxy_delta" in unrecorded["detail"]


def test_rsw_dtp_alpha_is_the_ratio():
    # RSW Table III: W2's AvgDTP 25.38 at α = 25, W1's 50.05 at α = 50
    found = run_check(
        "rsw_dtp_alpha", RANGES["rsw_dtp_alpha"], _reader(avg_dtp=[25.38, 50.05], rsw_alpha=[25.0, 50.0]), "recall@1"
    )
    assert found["value"] == pytest.approx((25.38 / 25 + 50.05 / 50) / 2) and found["pass"]
    inflated = run_check(
        "rsw_dtp_alpha", RANGES["rsw_dtp_alpha"], _reader(avg_dtp=[29.0], rsw_alpha=[13.8]), "recall@1"
    )
    assert not inflated["pass"]
    unrecorded = run_check("rsw_dtp_alpha", RANGES["rsw_dtp_alpha"], _reader(rsw_alpha=[13.8]), "recall@1")
    assert "eval.proxy_metrics: [avg_dtp]" in unrecorded["detail"]


def test_a_cell_without_runs_fails_as_such():
    found = run_check("loss_plateau", RANGES["loss_plateau"], lambda column: {}, "recall@1")
    assert not found["pass"] and found["detail"] == "not recorded: no runs of this cell"


# ---- the gate on a claim's verdict --------------------------------------------------------------------------


def _table(gain, plateau):
    """Per-seed table of experiment `exp`: ma clearly above mb (Δ = 12 points, p < 0.01); mb's untrained
    value `gain` below its trained one; every run's last-epoch loss move `plateau`."""
    rows = []
    for method, values in {"ma": [0.72, 0.74, 0.73], "mb": [0.60, 0.62, 0.61]}.items():
        for seed, v in enumerate(values):
            rows.append(
                {
                    "method": method,
                    "dataset": "synthetic",
                    "sweep": "",
                    "seed": seed,
                    "diverged": False,
                    "recall@1": v,
                    "recall@1@untrained": 0.61 - gain + 0.001 * seed,
                    "loss_last_change": plateau,
                }
            )
    return {"exp": pd.DataFrame(rows)}


def _gated_claim(**extra):
    cells = {"a": {"experiment": "exp", "method": "ma"}, "b": {"experiment": "exp", "method": "mb"}}
    checks = [{"check": "beats_untrained", "side": "b"}, {"check": "loss_plateau"}]
    return {
        "id": "x",
        "paper": "PFML",
        "source": "Table 1",
        "quote": "q",
        "claim": "a > b",
        "metrics": ["recall@1"],
        "sides": {"a": "A", "b": "B"},
        "better": ["a"],
        "worse": ["b"],
        "scales": {"miniature": {"datasets": ["synthetic"], "cells": cells, "checks": checks}},
        **extra,
    }


def test_a_failing_check_makes_a_significant_claim_not_testable():
    found = evaluate_claim(_gated_claim(), "miniature", _table(gain=0.10, plateau=0.30), RANGES)
    assert found["test_verdict"] == HOLDS and found["p"] < 0.01
    assert found["verdict"] == NOT_TESTABLE
    assert found["failing_checks"] == ["loss_plateau (A, synthetic)", "loss_plateau (B, synthetic)"]
    # the baseline that does not beat its untrained network: the same
    found = evaluate_claim(_gated_claim(), "miniature", _table(gain=-0.05, plateau=0.01), RANGES)
    assert found["verdict"] == NOT_TESTABLE and found["failing_checks"] == ["beats_untrained (B, synthetic)"]
    # a contradiction is gated as a support is
    flipped = evaluate_claim(_gated_claim(better=["b"], worse=["a"]), "miniature", _table(-0.05, 0.01), RANGES)
    assert flipped["test_verdict"] == CONTRADICTED and flipped["verdict"] == NOT_TESTABLE


def test_passing_checks_let_the_verdict_through():
    found = evaluate_claim(_gated_claim(), "miniature", _table(gain=0.10, plateau=0.01), RANGES)
    assert found["verdict"] == found["test_verdict"] == HOLDS and found["failing_checks"] == []
    assert [c["pass"] for c in found["checks"]] == [True, True, True]
    assert found["comparisons"][0]["b_untrained"]["mean"] == pytest.approx(51.1)  # 0.51 + 0.001 mean, in %
    flipped = evaluate_claim(_gated_claim(better=["b"], worse=["a"]), "miniature", _table(0.10, 0.01), RANGES)
    assert flipped["test_verdict"] == CONTRADICTED and flipped["verdict"] == "not reproduced"  # not earned (3 seeds)
    ungated = _gated_claim()
    del ungated["scales"]["miniature"]["checks"]
    assert evaluate_claim(ungated, "miniature", _table(-0.05, 0.3), RANGES)["verdict"] == HOLDS


def test_claim_p_is_the_verdicts():
    found = evaluate_claim(_gated_claim(), "miniature", _table(0.10, 0.01), RANGES)
    ref = stats.ttest_ind([72, 74, 73], [60, 62, 61], equal_var=False).pvalue
    assert found["p"] == pytest.approx(ref)  # one comparison: its p
    claim = _gated_claim(better=["b"], worse=["a"])
    assert evaluate_claim(claim, "miniature", _table(0.10, 0.01), RANGES)["p"] == pytest.approx(ref)  # k = 1


# ---- the catalogue, the schema and the code agree ------------------------------------------------------------


def test_the_schema_the_catalogue_and_the_code_name_the_same_checks():
    schema = yaml.safe_load(SCHEMA.read_text())
    assert sorted(schema["$defs"]["check_name"]["enum"]) == sorted(CHECKS) == sorted(RANGES)
    jsonschema.validate(read_catalogue(CATALOGUE), schema)
    for name, spec in RANGES.items():
        assert spec["source"] and ("low" in spec or "high" in spec), name


def test_the_schema_refuses_an_unknown_check_name():
    schema = yaml.safe_load(SCHEMA.read_text())
    doc = read_catalogue(CATALOGUE)
    bad = copy.deepcopy(doc)
    bad["claims"][0]["scales"]["miniature"]["checks"].append({"check": "proxies_look_fine"})
    with pytest.raises(jsonschema.ValidationError, match="proxies_look_fine"):
        jsonschema.validate(bad, schema)
    unranged = copy.deepcopy(doc)
    unranged["checks"]["vibes"] = {"what": "w", "low": 0, "source": "none"}
    with pytest.raises(jsonschema.ValidationError, match="vibes"):
        jsonschema.validate(unranged, schema)
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    with pytest.raises(ValueError, match="'proxies_look_fine' is not one of"):
        check_claims(bad["claims"], config, "miniature")


def test_every_miniature_claim_is_gated_by_the_baseline_and_a_plateau():
    for claim in read_catalogue(CATALOGUE)["claims"]:
        for scale, spec in claim["scales"].items():
            names = {entry["check"] for entry in spec.get("checks") or []}
            assert "beats_untrained" in names, (claim["id"], scale)
            assert names & {"loss_plateau", "validation_plateau"}, (claim["id"], scale)
        names = {e["check"] for e in claim["scales"]["miniature"]["checks"]}
        if claim["paper"] == "ASAP" and claim["id"] != "asap-baseline-grows-with-batch":
            assert "asap_alternations" in names, claim["id"]


def test_check_claims_names_a_bad_gate():
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    claim = copy.deepcopy(read_catalogue(CATALOGUE)["claims"][0])
    claim["scales"]["miniature"]["checks"] = [{"check": "beats_untrained", "side": "nope"}]
    with pytest.raises(ValueError, match=r"checks\[0\]\.side: 'nope'"):
        check_claims([claim], config, "miniature")
    claim["scales"]["miniature"]["checks"] = [{"check": "beats_untrained", "side": "pfml", "metric": "recall@1000"}]
    with pytest.raises(ValueError, match="has no metric"):
        check_claims([claim], config, "miniature")


@pytest.mark.slow
def test_rule_aggregate_reads_the_inputs_from_a_real_run(tmp_path):
    """One tiny PFML run (digits, 3 epochs of 4 steps, W₂ after training): rule aggregate's tables carry its
    untrained R@1 (metrics.json untrained_metrics), its W₂ and its loss's last-epoch move (train_log.csv)."""
    import json

    from dmlrepro.data import prepare
    from dmlrepro.report.aggregate import write_experiment_tables
    from dmlrepro.train import train_run
    from dmlrepro.train.state import RunDir

    prepare("digits", tmp_path / "data", progress=False)
    cfg = {
        "dataset": {"name": "digits", "root": str(tmp_path / "data"), "image_size": 32, "resize": 32, "batch_size": 32},
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [16, 32, 32], "strides": [2, 2, 2]},
            "embedding_size": 16,
        },
        "loss": {"name": "pfml", "hparams": {"proxies_per_class": 2}},
        "optimizer": {"name": "adam", "lr": 1e-3, "lr_mult": {"loss": 100}},
        "epochs": 3,
        "steps_per_epoch": 4,
        "seed": 3,
        "threads": 1,
        "device": "cpu",
        "eval": {"before_training": True, "proxy_metrics": ["w2"]},
    }
    run = RunDir(tmp_path / "run")
    train_run(cfg, run.root, progress=False)
    result = json.loads(run.metrics.read_text())
    record = {"run_id": "run", "method": "pfml", "dataset": "digits", "seed": 3, "sweep": {}}
    table, seeds = tmp_path / "t.csv", tmp_path / "s.csv"
    write_experiment_tables(
        [record],
        [str(run.metrics)],
        [str(run.train_log)],
        ["recall@1", "w2"],
        mlrc=False,
        last_finite=False,
        table=str(table),
        seeds=str(seeds),
    )
    (row,) = pd.read_csv(seeds).to_dict("records")
    assert row["recall@1@untrained"] == pytest.approx(result["untrained_metrics"]["recall@1"], abs=1e-6)
    assert row["w2"] == pytest.approx(result["proxy_metrics"]["w2"], abs=1e-6)
    assert row["proxy_delta"] == 0.2  # the loss's δ, PFML's default (the config leaves it): W₂'s gate bound
    losses = pd.read_csv(run.train_log).query("epoch > 0")["loss"].to_numpy()
    assert row["loss_last_change"] == pytest.approx(
        abs(losses[-1] - losses[-2]) / (losses.max() - losses.min()), abs=1e-6
    )
    assert pd.isna(row["alternations"]) and pd.isna(row["rsw_alpha"])  # no validation split, not RSW
    aggregated = pd.read_csv(table)
    assert aggregated["recall@1@untrained_mean"].iloc[0] == pytest.approx(row["recall@1@untrained"], abs=1e-6)
