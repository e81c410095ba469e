"""Training time from train_log.csv (PFML supp. Table 6) and how aggregation treats it."""

import math

import pytest

from dmlrepro.report import aggregate_runs, timing_metrics


def test_timing_leaves_out_the_untrained_evaluation(tmp_path):
    log = tmp_path / "train_log.csv"
    log.write_text(
        "epoch,phase,steps,loss,lr_backbone,seconds,test_recall@1\n"
        "0,main,0,,,9.000,0.04\n1,main,5,1.2,0.001,2.000,\n2,main,5,1.1,0.001,4.000,0.2\n"
    )
    assert timing_metrics(log) == {"seconds_per_epoch": pytest.approx(3.0), "train_hours": pytest.approx(6.0 / 3600)}
    only_row0 = tmp_path / "untrained.csv"
    only_row0.write_text("epoch,phase,steps,loss,lr_backbone,seconds,test_recall@1\n0,main,0,,,9.000,0.04\n")
    assert timing_metrics(only_row0) == {}


def test_a_diverged_run_keeps_its_time_but_not_its_metrics():
    records = [
        {
            "method": "pfml",
            "dataset": "d",
            "sweep": {},
            "seed": s,
            "result": {"status": status, "metrics": {"recall@1": r}},
            "timing": {"seconds_per_epoch": t},
        }
        for s, status, r, t in [(0, "completed", 0.5, 2.0), (1, "diverged", 0.9, 4.0)]
    ]
    row = aggregate_runs(records, ["recall@1", "seconds_per_epoch"]).iloc[0]
    assert row["recall@1_mean"] == 0.5 and math.isnan(row["recall@1_std"])
    assert row["seconds_per_epoch_mean"] == 3.0 and row["seeds"] == 2 and row["diverged"] == 1
