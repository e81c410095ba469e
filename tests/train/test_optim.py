"""Parameter groups and their lrs, schedules, warm-up, BN freezing, gradient clipping, followup.

References are independent of the engine: a plain SGD update computed by hand, torch's own
StepLR / CosineAnnealingLR, and the initial weights rebuilt from the seed.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from dmlrepro.train import read_checkpoint, resolve_run_config, train_run
from dmlrepro.train.checkpoint import checkpoint_name
from dmlrepro.train.engine import Trainer, _stored_yaml
from dmlrepro.train.model_and_loss import build_run_model
from dmlrepro.train.optim import group_lrs
from dmlrepro.train.preemption import StopFlag
from dmlrepro.train.runtime import resolve_runtime
from dmlrepro.train.seeding import seed_everything


def _trainer(cfg: dict, tmp_path: Path) -> Trainer:
    cfg = resolve_runtime(resolve_run_config(cfg), torch.device("cpu"))
    return Trainer(cfg, _stored_yaml(cfg), tmp_path, False, StopFlag())


def _first_batch(t: Trainer, epoch: int = 1):
    t.parts.sampler.set_epoch(epoch, 0)
    from dmlrepro.train.run_data import SeededDataset

    loader = torch.utils.data.DataLoader(SeededDataset(t.parts.train_ds), batch_sampler=t.parts.sampler)
    x, y, _ = next(iter(loader))
    return x, y


def test_groups_get_lr_times_multiplier_in_an_sgd_step(tiny, tmp_path):
    lr, mult = 0.01, {"backbone": 0.5, "head": 2.0, "loss": 100.0}
    t = _trainer(tiny(optimizer={"name": "sgd", "lr": lr, "momentum": 0.0, "lr_mult": mult}), tmp_path)
    names = {g["name"]: g for g in t.parts.optimizer.param_groups}
    assert {n: g["lr"] for n, g in names.items()} == {n: lr * m for n, m in mult.items()}
    # proxies are exactly the loss group; backbone = the trunk
    assert [id(p) for p in names["loss"]["params"]] == [id(p) for p in t.parts.loss.parameters()]
    assert {id(p) for p in names["backbone"]["params"]} == {id(p) for p in t.parts.model.backbone.parameters()}
    t.parts.apply_epoch_settings(1)
    t.parts.model.train()
    before = {id(p): p.detach().clone() for g in t.parts.optimizer.param_groups for p in g["params"]}
    assert t.step(*_first_batch(t)) is None
    for g in t.parts.optimizer.param_groups:
        for p in g["params"]:
            step = before[id(p)].double() - p.detach().double()
            expected = lr * mult[g["name"]] * p.grad.double()  # plain SGD, by hand
            tol = 1e-3 * expected.abs().max() + 1e-6 * before[id(p)].abs().max()  # float32 rounding of p
            assert (step - expected).abs().max() <= tol, g["name"]
    assert any(p.grad.abs().max() > 0 for p in t.parts.loss.parameters())


def test_schedules_match_torch_schedulers():
    for sched, make in [
        ({"name": "step", "step": 2, "gamma": 0.3}, lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.3)),
        (
            {"name": "cosine", "min_lr_ratio": 0.1},
            lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 7, eta_min=0.1 * 0.02),
        ),
    ]:
        cfg = resolve_run_config({"optimizer": {"lr": 0.02, "lr_mult": {"loss": 10}}, "epochs": 7, "schedule": sched})
        opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.02)
        s = make(opt)
        for epoch in range(1, 8):
            lrs = group_lrs(cfg, epoch)
            assert math.isclose(lrs["backbone"], opt.param_groups[0]["lr"], rel_tol=1e-12), (sched, epoch)
            assert math.isclose(lrs["loss"], 10 * opt.param_groups[0]["lr"], rel_tol=1e-12)
            opt.step()
            s.step()


@pytest.mark.slow
def test_followup_switches_loss_attributes_and_lrs(tiny, tmp_path):
    cfg = tiny(
        loss={"name": "rsw", "hparams": {"alpha": 28.4, "k1": 0.93, "k2": 1.15, "scale": 4.5}},
        model__l2_normalize=False,
        optimizer={"name": "adam", "lr": 0.01, "eps": 1.0, "lr_mult": {"loss": 100}},
        followup={
            "epochs": 1,
            "loss": {"alpha": 24.68, "k1": 0.95, "k2": 1.2, "scale": 1.0},
            "lr": 0.001,
            "lr_mult": {"loss": 0.5},
        },
    )
    t = _trainer(cfg, tmp_path)
    assert t.parts.optimizer.defaults["eps"] == 1.0
    lrs2 = t.parts.apply_epoch_settings(2)
    assert (t.parts.loss.alpha, t.parts.loss.k1, t.parts.loss.k2, t.parts.loss.scale) == (28.4, 0.93, 1.15, 4.5)
    assert lrs2 == {"backbone": 0.01, "head": 0.01, "loss": 1.0}
    lrs3 = t.parts.apply_epoch_settings(3)
    assert (t.parts.loss.alpha, t.parts.loss.k1, t.parts.loss.k2, t.parts.loss.scale) == (24.68, 0.95, 1.2, 1.0)
    assert lrs3 == {"backbone": 0.001, "head": 0.001, "loss": 0.0005}
    t.parts.apply_epoch_settings(1)  # resuming in phase 1 restores the phase-1 values
    assert (t.parts.loss.alpha, t.parts.loss.scale) == (28.4, 4.5)
    res = train_run(cfg, tmp_path / "run", progress=False)
    assert res["status"] == "completed"
    rows = (tmp_path / "run" / "train_log.csv").read_text().splitlines()
    header = rows[0].split(",")
    last = dict(zip(header, rows[-1].split(",")))
    assert last["phase"] == "2" and float(last["lr_loss"]) == 0.0005 and float(last["lr_backbone"]) == 0.001


def test_grad_clip_by_value_only_on_chosen_groups(tiny, tmp_path):
    t = _trainer(
        tiny(optimizer={"name": "sgd", "lr": 1.0}, grad_clip={"value": 1e-5, "groups": ["backbone", "head"]}), tmp_path
    )
    t.parts.apply_epoch_settings(1)
    t.parts.model.train()
    assert t.step(*_first_batch(t)) is None
    for p in t.parts.model.parameters():
        assert p.grad.abs().max() <= 1e-5
    assert max(p.grad.abs().max() for p in t.parts.loss.parameters()) > 1e-5  # not clipped


def _backbone_state(state):
    return {k[len("backbone.") :]: v for k, v in state["model"].items() if k.startswith("backbone.")}


def _initial_model(cfg):
    cfg = resolve_run_config(cfg)
    seed_everything(cfg["seed"])
    return build_run_model(cfg)


@pytest.mark.slow
def test_warmup_freezes_backbone_and_bn_freeze_keeps_running_stats(tiny, tmp_path):
    common = dict(epochs=2, warmup_epochs=1, checkpoint={"keep": 3}, eval={"every": 0, "before_training": False})
    # Proxy-Anchor semantics: BN frozen (stats + affine), affine trainable again after warm-up
    cfg = tiny(**common, bn_freeze={"running_stats": True, "affine": True, "unfreeze_affine_after_warmup": True})
    train_run(cfg, tmp_path / "frozen", progress=False)
    init = _initial_model(cfg).state_dict()
    init_bb = {k[len("backbone.") :]: v for k, v in init.items() if k.startswith("backbone.")}
    e1 = read_checkpoint(tmp_path / "frozen" / "checkpoints" / checkpoint_name(2, 0))
    e2 = read_checkpoint(tmp_path / "frozen" / "checkpoints" / checkpoint_name(3, 0))
    for k, v in _backbone_state(e1).items():  # whole backbone unchanged after the warm-up epoch
        assert torch.equal(v, init_bb[k]), k
    head_keys = [k for k in init if k.startswith("head.")]
    assert head_keys and any(not torch.equal(e1["model"][k], init[k]) for k in head_keys)
    assert not torch.equal(e1["loss"]["proxies"], e2["loss"]["proxies"])
    bb2 = _backbone_state(e2)
    stats = [k for k in bb2 if k.endswith(("running_mean", "running_var"))]
    affine = [k for k in bb2 if k.endswith(("weight", "bias")) and bb2[k].dim() == 1]  # BN gamma/beta
    assert stats and affine
    for k in stats:
        assert torch.equal(bb2[k], init_bb[k]), k  # running statistics never move
    assert any(not torch.equal(bb2[k], init_bb[k]) for k in affine)  # affine trains after warm-up
    conv = [k for k in bb2 if bb2[k].dim() == 4]
    assert all(not torch.equal(bb2[k], init_bb[k]) for k in conv)  # the trunk trains after warm-up

    # control: without bn_freeze the warm-up still freezes the weights, but BN statistics move
    cfg2 = tiny(**common)
    train_run(cfg2, tmp_path / "free", progress=False)
    f1 = _backbone_state(read_checkpoint(tmp_path / "free" / "checkpoints" / checkpoint_name(2, 0)))
    for k in conv:
        assert torch.equal(f1[k], init_bb[k]), k
    assert all(not torch.equal(f1[k], init_bb[k]) for k in stats if k.endswith("running_mean"))
