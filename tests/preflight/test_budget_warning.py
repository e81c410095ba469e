"""A training job whose first full epoch projects past its time budget says so in its log
(dmlrepro.budget.warn_time_budget, called by the training loop after each epoch)."""

import pytest

from dmlrepro.budget import RETRIES_ENV, TIME_LIMIT_ENV
from dmlrepro.train import train_run

pytestmark = pytest.mark.slow

WARNING = "this run cannot finish"


def run(tmp_path, name, warmup=0):
    cfg = {
        "dataset": {
            "name": "synthetic",
            "root": str(tmp_path / "data"),
            "image_size": 32,
            "resize": 32,
            "train_crop": "random",
            "batch_size": 16,
            "params": {"num_classes": 8, "images_per_class": 8, "size": 32},
        },
        "model": {"backbone": "tiny_cnn", "embedding_size": 8},
        "loss": {"name": "proxy_anchor"},
        "epochs": 3,
        "warmup_epochs": warmup,
        "steps_per_epoch": 2,
        "eval": {"every": 0, "before_training": False},
        "threads": 1,
    }
    train_run(cfg, tmp_path / name, progress=False)


def test_over_budget_job_warns_after_its_first_full_epoch(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(TIME_LIMIT_ENV, "1e-6")  # minutes: no epoch fits
    monkeypatch.setenv(RETRIES_ENV, "2")
    run(tmp_path, "over")
    lines = [line for line in capsys.readouterr().out.splitlines() if WARNING in line]
    assert len(lines) == 1 and lines[0].startswith("dmlrepro train: warning: epoch 1 took")
    assert "3 epochs project to" in lines[0] and "× (retries 2 + 1)" in lines[0]
    run(tmp_path, "warmup", warmup=1)  # the warm-up epoch's frozen trunk is no measure: after epoch 2
    lines = [line for line in capsys.readouterr().out.splitlines() if WARNING in line]
    assert len(lines) == 1 and "epoch 2 took" in lines[0]


def test_no_warning_within_budget_or_without_a_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(TIME_LIMIT_ENV, "600")
    run(tmp_path, "fits")
    monkeypatch.delenv(TIME_LIMIT_ENV)
    run(tmp_path, "local")
    assert WARNING not in capsys.readouterr().out
