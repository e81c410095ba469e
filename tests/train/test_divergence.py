"""A run whose lr blows up stops cleanly with status "diverged", the epoch/step, and the last
finite evaluation; train_run returns normally and the CLI exits 0 so a sweep goes on."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from dmlrepro.train import train_run
from dmlrepro.train.cli import train_main


def _exploding(tiny):
    # epoch 1 trains normally at lr 1e-3; the step schedule multiplies the lr by 1e30 from epoch 2
    return tiny(
        loss={"name": "rsw", "hparams": {"alpha": 10.0, "k1": 0.5, "k2": 1.0}},
        model__l2_normalize=False,
        optimizer={"name": "sgd", "lr": 1e-3},
        schedule={"name": "step", "step": 1, "gamma": 1e30},
        eval={"distance": "euclidean"},
    )


@pytest.mark.slow
def test_divergence_is_recorded_with_last_finite_metrics(tiny, tmp_path):
    out = tmp_path / "run"
    res = train_run(_exploding(tiny), out, progress=False)  # returns, does not raise
    assert res["status"] == "diverged"
    assert res["diverged_at"]["epoch"] == 2 and res["diverged_at"]["what"] in ("loss", "gradients")
    assert 1 <= res["diverged_at"]["step"] <= 4 and res["diverged_at"]["global_step"] == 4 + res["diverged_at"]["step"]
    assert res["epoch"] == 1  # the last finite evaluation is the end of epoch 1
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk == res
    rows = [r.split(",") for r in (out / "train_log.csv").read_text().splitlines()]
    header = rows[0]
    by_epoch = {r[0]: dict(zip(header, r)) for r in rows[1:]}
    assert float(by_epoch["1"]["test_recall@1"]) == res["metrics"]["recall@1"]
    assert all(math.isfinite(v) for v in res["metrics"].values()) and set(res["metrics"]) >= {"recall@1", "map@r"}
    assert math.isnan(float(by_epoch["2"]["loss"]))
    assert not (out / "embeddings_test.npz").exists()


@pytest.mark.slow
def test_cli_exit_code_is_zero_for_a_diverged_run(tiny, tmp_path, capsys):
    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump(_exploding(tiny)))
    assert train_main([str(conf), str(tmp_path / "run"), "--no-progress"]) == 0
    assert "status: diverged" in capsys.readouterr().out
