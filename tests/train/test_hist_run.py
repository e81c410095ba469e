"""HIST in the engine: its HGNN is the linked optimizer group ``loss.hgnn`` at ``hgnn_lr_factor`` × the
backbone's lr (the official code's ``--lr-hgnn-factor``), through the schedule; a short run trains, logs
that group's lr and resumes bit-identically (the HGNN's BatchNorm statistics are part of the loss state)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from dmlrepro.train import read_checkpoint, resolve_run_config, train_run
from dmlrepro.train.checkpoint import checkpoint_name
from dmlrepro.train.engine import Trainer, _stored_yaml
from dmlrepro.train.preemption import StopFlag
from dmlrepro.train.runtime import resolve_runtime

HIST = {"name": "hist", "hparams": {"tau": 16.0, "alpha": 1.1, "hgnn_hidden": 32, "hgnn_lr_factor": 5.0}}


def hist_config(tiny, **overrides):
    return tiny(
        loss=HIST,
        model__preset="hist",
        model__l2_normalize=False,
        optimizer={"name": "sgd", "lr": 0.01, "momentum": 0.0, "lr_mult": {"backbone": 2.0, "loss": 100.0}},
        schedule={"name": "step", "step": 2, "gamma": 0.5},
        **overrides,
    )


def test_hgnn_group_follows_the_backbone_lr_times_the_factor(tiny, tmp_path):
    cfg = resolve_runtime(resolve_run_config(hist_config(tiny)), torch.device("cpu"))
    t = Trainer(cfg, _stored_yaml(cfg), tmp_path, False, StopFlag())
    groups = {g["name"]: g for g in t.parts.optimizer.param_groups}
    assert set(groups) == {"backbone", "head", "loss", "loss.hgnn"}
    assert {id(p) for p in groups["loss.hgnn"]["params"]} == {id(p) for p in t.parts.loss.hgnn.parameters()}
    assert {id(p) for p in groups["loss"]["params"]} == {id(t.parts.loss.means), id(t.parts.loss.log_vars)}
    for epoch, factor in [(1, 1.0), (2, 1.0), (3, 0.5)]:
        lrs = t.parts.apply_epoch_settings(epoch)
        assert lrs == {
            "backbone": 0.02 * factor,
            "head": 0.01 * factor,
            "loss": 1.0 * factor,
            "loss.hgnn": 0.02 * 5.0 * factor,
        }
    t.parts.apply_epoch_settings(1)
    t.parts.model.train()
    t.parts.loss.train()
    t.parts.sampler.set_epoch(1, 0)
    from dmlrepro.train.run_data import SeededDataset

    x, y, _ = next(iter(torch.utils.data.DataLoader(SeededDataset(t.parts.train_ds), batch_sampler=t.parts.sampler)))
    before = [p.detach().clone() for p in t.parts.loss.hgnn.parameters()]
    assert t.step(x, y) is None
    for p, b in zip(t.parts.loss.hgnn.parameters(), before):  # plain SGD at 0.1 on the HGNN, by hand
        assert torch.allclose(b - p.detach(), 0.1 * p.grad, rtol=1e-4, atol=1e-7)


def _log(run: Path) -> list[dict[str, str]]:
    with open(run / "train_log.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_hist_run_logs_the_hgnn_lr_and_resumes_identically(tiny, tmp_path):
    cfg = hist_config(tiny, checkpoint={"keep": 5})
    full = train_run(cfg, tmp_path / "full", progress=False)
    assert full["status"] == "completed"
    log = _log(tmp_path / "full")
    assert [float(r["lr_loss.hgnn"]) for r in log if r["epoch"] != "0"] == [0.1, 0.1, 0.05]
    # resume from the end of epoch 1: the same final weights, loss parameters and HGNN statistics
    part = tmp_path / "part"
    (part / "checkpoints").mkdir(parents=True)
    src = tmp_path / "full" / "checkpoints" / checkpoint_name(2, 0)
    (part / "checkpoints" / src.name).write_bytes(src.read_bytes())
    train_run(cfg, part, progress=False)
    a = read_checkpoint(tmp_path / "full" / "checkpoints" / checkpoint_name(4, 0))
    b = read_checkpoint(part / "checkpoints" / checkpoint_name(4, 0))
    assert a["loss"]["hgnn.bn1.running_mean"].abs().sum() > 0
    for key in a["loss"]:
        assert torch.equal(a["loss"][key], b["loss"][key]), key
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
