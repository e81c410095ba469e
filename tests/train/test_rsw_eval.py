"""Per-epoch proxy metrics (RSW Fig. 9's AvgDTP in train_log.csv) and evaluation under test-image
corruptions (RSW Table IV), each against a literal computation from the saved checkpoints."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from dmlrepro.train import ConfigError, RunInterrupted, resolve_run_config, train_run
from dmlrepro.train.checkpoint import checkpoint_name, list_checkpoints, read_checkpoint
from dmlrepro.train.model_and_loss import build_run_loss, build_run_model
from dmlrepro.train.run_data import build_train_eval, open_manifest
from dmlrepro.train.run_evaluation import compute_embeddings

from .conftest import run_cli


def _rsw(tiny, **overrides):
    return tiny(
        loss__name="rsw",
        loss__hparams={"alpha": 2.0, "k1": 0.5, "k2": 1.5},
        model__l2_normalize=False,
        eval__distance="euclidean",
        **overrides,
    )


def _model_and_loss(cfg, state):
    cfg = resolve_run_config(cfg)
    model = build_run_model(cfg)
    model.load_state_dict(state["model"])
    loss = build_run_loss(cfg, state["loss"]["proxies"].shape[0], model.embedding_size)
    loss.load_state_dict(state["loss"])
    return cfg, model, loss


@pytest.mark.slow
def test_avg_dtp_per_epoch_equals_a_literal_loop_at_every_checkpoint(tiny, tmp_path):
    cfg = _rsw(
        tiny, eval__every=1, eval__proxy_metrics=["avg_dtp"], eval__proxy_metrics_per_epoch=True, checkpoint__keep=10
    )
    record = train_run(cfg, tmp_path / "run", progress=False)
    log = pd.read_csv(tmp_path / "run" / "train_log.csv")
    assert list(log["epoch"]) == [0, 1, 2, 3] and log["avg_dtp"].notna().all()
    assert record["proxy_metrics"]["avg_dtp"] == log["avg_dtp"].iloc[-1]
    checked = 0
    for path in list_checkpoints(tmp_path / "run" / "checkpoints"):
        state = read_checkpoint(path)
        epoch = state["position"]["epoch"] - 1  # the checkpoint after epoch e says "next: e + 1"
        rcfg, model, loss = _model_and_loss(cfg, state)
        ds = build_train_eval(rcfg["dataset"], open_manifest(rcfg["dataset"]), model)
        emb, labels, _ = compute_embeddings(model, ds, batch_size=512, device=torch.device("cpu"))
        classes = np.unique(labels)
        y = np.searchsorted(classes, labels)
        proxies = loss.proxies.detach().double().numpy()
        per_class = []
        for c in range(len(classes)):  # eq. 9 as printed: (1/C) Σ_c (1/|P_c|) Σ_{e∈P_c} ‖e − p_c‖
            dists = [float(np.sqrt(((e.astype(np.float64) - proxies[c]) ** 2).sum())) for e in emb[y == c]]
            per_class.append(sum(dists) / len(dists))
        assert log.loc[log["epoch"] == epoch, "avg_dtp"].item() == pytest.approx(
            sum(per_class) / len(per_class), rel=1e-5
        )
        checked += 1
    assert checked == 3


@pytest.mark.slow
def test_per_epoch_proxy_metrics_resume_bit_for_bit(tiny, tmp_path):
    cfg = _rsw(tiny, eval__every=1, eval__proxy_metrics=["avg_dtp"], eval__proxy_metrics_per_epoch=True)
    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert run_cli(["train", str(conf), str(ref), "--no-progress"]).returncode == 0
    assert (
        run_cli(["train", str(conf), str(out), "--no-progress"], {"DMLREPRO_TEST_SIGNAL_AFTER_STEPS": "6"}).returncode
        == 75
    )
    assert run_cli(["train", str(conf), str(out), "--no-progress"]).returncode == 0
    drop = ["seconds"]
    pd.testing.assert_frame_equal(
        pd.read_csv(ref / "train_log.csv").drop(columns=drop), pd.read_csv(out / "train_log.csv").drop(columns=drop)
    )
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (ref, out))
    assert a["metrics"] == b["metrics"] and a["proxy_metrics"] == b["proxy_metrics"]


@pytest.mark.slow
def test_corruption_metrics_equal_a_direct_evaluation(tiny, tmp_path):
    from dmlrepro.data import ManifestDataset, build_transform
    from dmlrepro.data.corruptions import build_corruption

    cfg = _rsw(tiny, eval__corruptions=[{"name": "gaussian", "severity": 3}, {"name": "cutout"}], eval__nmi=True)
    record = train_run(cfg, tmp_path / "run", progress=False)
    assert set(record["corruption_metrics"]) >= {"recall@1@gaussian_3", "map@r@gaussian_3", "recall@1@cutout"}
    assert "nmi" in record["metrics"] and not any(k.startswith("nmi") for k in record["corruption_metrics"])
    state = read_checkpoint(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    rcfg, model, _ = _model_and_loss(cfg, state)
    model.eval()
    d = rcfg["dataset"]
    for name, severity, key in (("gaussian", 3, "gaussian_3"), ("cutout", None, "cutout")):
        transform = build_transform(
            False,
            d["image_size"],
            resize=d["resize"],
            normalization="imagenet",
            corruption=build_corruption(name, severity=severity, seed=0),
        )
        ds = ManifestDataset(open_manifest(d), split="test", transform=transform)
        with torch.no_grad():
            emb = np.concatenate(
                [
                    model(torch.stack([ds[i][0] for i in range(j, min(j + 128, len(ds)))])).numpy()
                    for j in range(0, len(ds), 128)
                ]
            ).astype(np.float64)
        labels = np.asarray([ds[i][1] for i in range(len(ds))])
        dist = np.sqrt(((emb[:, None] - emb[None]) ** 2).sum(-1))  # brute force, the query left out
        np.fill_diagonal(dist, np.inf)
        recall1 = float(np.mean(labels[dist.argmin(1)] == labels))
        assert record["corruption_metrics"][f"recall@1@{key}"] == pytest.approx(recall1, abs=1.5 / len(ds))


@pytest.mark.slow
def test_a_signal_during_the_corruption_evaluation_stops_after_the_batch_and_the_rerun_finishes(
    tiny, tmp_path, monkeypatch
):
    """SIGTERM as the final model starts embedding the first corrupted test set: the pass stops after
    its batch, the run exits (RunInterrupted: exit 75) with the final checkpoint and no metrics.json,
    before the next corruption; the rerun finishes with an uninterrupted run's metrics."""
    import dmlrepro.train.run_evaluation as run_evaluation  # where corruption_metrics looks it up

    cfg = _rsw(
        tiny, eval__corruptions=[{"name": "gaussian", "severity": 3}, {"name": "cutout"}], dataset__eval_batch_size=64
    )
    reference = train_run(cfg, tmp_path / "ref", progress=False)
    out, built, orig = tmp_path / "run", [], run_evaluation.build_test_corrupted

    def corrupted(*args, **kwargs):
        built.append(1)
        os.kill(os.getpid(), signal.SIGTERM)
        return orig(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(run_evaluation, "build_test_corrupted", corrupted)
        with pytest.raises(RunInterrupted):
            train_run(cfg, out, progress=False)
    assert built == [1]  # the second corruption was never built
    assert not (out / "metrics.json").exists()
    assert list_checkpoints(out / "checkpoints")[-1].name == checkpoint_name(cfg["epochs"] + 1, 0)
    record = train_run(cfg, out, progress=False)
    assert record["corruption_metrics"] == reference["corruption_metrics"] and record["metrics"] == reference["metrics"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"eval__corruptions": [{"name": "fog"}]}, "eval.corruptions"),
        ({"eval__corruptions": [{"name": "gaussian", "severity": 7}]}, "severity"),
        ({"eval__corruptions": [{"name": "gaussian"}], "eval__select": "best_test"}, "eval.corruptions"),
        ({"eval__proxy_metrics_per_epoch": True}, "proxy_metrics_per_epoch"),
    ],
)
def test_bad_rsw_eval_keys_are_rejected(tiny, overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run_config(_rsw(tiny, **overrides))


def test_late_keys_at_their_default_leave_run_ids_unchanged(tiny):
    from dmlrepro.runs import config_hash

    cfg = resolve_run_config(_rsw(tiny))
    explicit = resolve_run_config(_rsw(tiny, eval__corruptions=[], eval__proxy_metrics_per_epoch=False))
    assert config_hash(cfg) == config_hash(explicit)
    stripped = {k: v for k, v in cfg["eval"].items() if k not in ("corruptions", "proxy_metrics_per_epoch")}
    assert config_hash({**cfg, "eval": stripped}) == config_hash(cfg)
    assert config_hash(resolve_run_config(_rsw(tiny, eval__corruptions=[{"name": "jigsaw"}]))) != config_hash(cfg)
