"""CLI functions, evaluate_run, run-directory contents, best-test selection, launch (submitit debug)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml

from dmlrepro.evaluation import load_embeddings, retrieval_metrics
from dmlrepro.train import evaluate_run
from dmlrepro.train.cli import evaluate_main, launch_main, train_main


def _write(tmp_path, cfg, name="run.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


@pytest.mark.slow
def test_train_and_evaluate_cli(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    conf = _write(tmp_path, tiny(eval={"every": 2, "nmi": True}))
    assert train_main([conf, str(out), "--no-progress", "--set", "optimizer.lr=2e-3"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        ".lock",
        "checkpoints",
        "config.yaml",
        "embeddings_test.npz",
        "final_proxies.npz",
        "metrics.json",
        "train_log.csv",
    ]
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["optimizer"]["lr"] == 2e-3 and resolved["optimizer"]["name"] == "adam"  # --set + defaults
    m = json.loads((out / "metrics.json").read_text())
    assert m["status"] == "completed" and m["epoch"] == 3 and m["select"] == "last" and "nmi" in m["metrics"]
    # metrics agree with an independent computation on the saved embeddings
    emb = load_embeddings(out / "embeddings_test.npz")
    assert emb.meta["epoch"] == 3 and emb.split == "test"
    ref = retrieval_metrics(emb.embeddings, emb.labels, ks=(1, 2, 4, 8), distance="cosine")
    assert all(m["metrics"][k] == pytest.approx(v, abs=1e-12) for k, v in ref.items())
    rows = list(csv.DictReader(open(out / "train_log.csv")))
    assert [r["epoch"] for r in rows] == ["0", "1", "2", "3"]
    assert rows[1]["test_recall@1"] == "" and rows[2]["test_recall@1"] != ""  # eval.every = 2 (+ last)
    assert float(rows[3]["test_recall@1"]) == m["metrics"]["recall@1"]
    assert m["untrained_metrics"]["recall@1"] == float(rows[0]["test_recall@1"])
    # evaluate recomputes the same numbers; without the embeddings it rebuilds them from the checkpoint
    capsys.readouterr()
    assert evaluate_main([str(out)]) == 0
    assert "recall@1" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["metrics"] == m["metrics"]
    (out / "embeddings_test.npz").unlink()
    again = evaluate_run(out)
    assert again["metrics"] == m["metrics"] and again["status"] == "completed"
    assert np.array_equal(load_embeddings(out / "embeddings_test.npz").embeddings, emb.embeddings)
    # a finished run is not trained again; a different config in the same directory is refused
    assert train_main([conf, str(out), "--no-progress", "--set", "optimizer.lr=2e-3"]) == 0
    assert "already finished" in capsys.readouterr().out
    assert train_main([conf, str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "optimizer.lr" in err and "different config" in err


def test_bad_config_exit_code_names_key(tiny, tmp_path, capsys):
    conf = _write(tmp_path, tiny(optimizer={"name": "adam", "lr": -0.1}))
    assert train_main([conf, str(tmp_path / "run")]) == 2
    assert "optimizer.lr" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.slow
def test_best_test_selection(tiny, tmp_path):
    out = tmp_path / "run"
    cfg = tiny(epochs=4, optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9}, eval={"select": "best_test"})
    assert train_main([_write(tmp_path, cfg), str(out), "--no-progress"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    rows = [r for r in csv.DictReader(open(out / "train_log.csv")) if r["epoch"] != "0"]
    r1 = [float(r["test_recall@1"]) for r in rows]
    best = 1 + int(np.argmax(r1))  # first epoch with the highest test R@1
    assert best < 4, "this setting is meant to peak before the last epoch (otherwise the test proves nothing)"
    assert m["epoch"] == m["best_epoch"] == best and m["metrics"]["recall@1"] == max(r1)
    assert load_embeddings(out / "embeddings_test.npz").meta["epoch"] == best
    (out / "embeddings_test.npz").unlink()
    assert evaluate_run(out)["metrics"] == m["metrics"]  # rebuilt from best_model.pt


@pytest.mark.slow
def test_launch_with_submitit_debug_executor(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    conf = _write(tmp_path, tiny(epochs=1, steps_per_epoch=2))
    assert launch_main([conf, str(out), "--executor", "debug", "--gpus", "0", "--wait"]) == 0
    assert "status: completed" in capsys.readouterr().out
    assert json.loads((out / "metrics.json").read_text())["status"] == "completed"
