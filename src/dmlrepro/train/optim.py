"""Optimizer with named parameter groups, the lr of each group per epoch, and trainability.

Groups (``config.GROUPS``): ``backbone`` (the trunk), ``head`` (pooling + embedding head),
``loss`` (the loss's own parameters: proxies, class weights). Each group's lr at epoch e
(1-based) is a pure function of the config and e:

    lr_g(e) = base_lr(phase) * lr_mult_g(phase) * schedule(e)

phase 2 ("followup", RSW) covers the last ``followup.epochs`` epochs (``followup.trigger: epochs``)
or the epochs from the one after validation patience first ran out (``trigger: plateau``, RSW App. D:
the engine passes that epoch, ``followup_start``, so this stays a pure function) and replaces ``base_lr``
by ``followup.lr`` and the multipliers given in ``followup.lr_mult``; ``schedule`` is 1 (none),
``gamma ** ((e-1) // step)`` (step; torch's StepLR stepped once per epoch) or
``r + (1-r) (1 + cos(pi (e-1) / E)) / 2`` (cosine, r = min_lr_ratio). Being a function of the
epoch, the schedule needs no state of its own to resume.

A loss may train some of its parameters at a fixed ratio of another group's lr (HIST's HGNN at
``lr × lr_hgnn_factor``): its declaration's ``lr_groups(loss)`` (dmlrepro.losses.registry) returns
``{name: (params, group, ratio)}``, which become the optimizer groups ``loss.<name>`` with
lr = ``ratio × lr_group(e)`` and the loss group's weight decay; their parameters leave the ``loss`` group.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from dmlrepro.losses import spec_of
from dmlrepro.models import parameter_groups

from .config import GROUPS


def linked_groups(loss: nn.Module) -> dict[str, tuple[list[nn.Parameter], str, float]]:
    """The loss's parameter groups whose lr is a fixed ratio of a config group's, as its declaration
    gives them: ``{"loss.<name>": (params, group, ratio)}`` (empty for most losses)."""
    spec = spec_of(loss)
    linked = spec.lr_groups(loss) if spec is not None and spec.lr_groups is not None else {}
    return {f"loss.{name}": (list(params), group, float(ratio)) for name, (params, group, ratio) in linked.items()}


def named_groups(model: nn.Module, loss: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The config groups (``GROUPS``), then the loss's linked groups (``linked_groups``)."""
    groups = {g["name"]: list(g["params"]) for g in parameter_groups(model)}
    linked = {name: params for name, (params, _, _) in linked_groups(loss).items()}
    in_linked = {id(p) for params in linked.values() for p in params}
    groups["loss"] = [p for p in loss.parameters() if id(p) not in in_linked]
    return {**{name: groups.get(name, []) for name in GROUPS}, **linked}


def base_group(name: str) -> str:
    """The config group a (possibly linked, ``loss.<name>``) optimizer group belongs to."""
    return name.split(".", 1)[0]


def in_followup(cfg: dict[str, Any], epoch: int, followup_start: int | None = None) -> bool:
    """Whether ``epoch`` is in phase 2. Trigger ``epochs``: the last ``followup.epochs`` epochs
    (``followup_start`` is ignored). Trigger ``plateau``: from ``followup_start`` on, the epoch the
    run switched at (``None``: it has not switched)."""
    f = cfg["followup"]
    if f.get("trigger", "epochs") == "plateau":
        return followup_start is not None and epoch >= followup_start
    return f["epochs"] > 0 and epoch > cfg["epochs"] - f["epochs"]


def schedule_factor(cfg: dict[str, Any], epoch: int) -> float:
    s = cfg["schedule"]
    if s["name"] == "step":
        return float(s["gamma"]) ** ((epoch - 1) // s["step"])
    if s["name"] == "cosine":
        r = s["min_lr_ratio"]
        return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / cfg["epochs"]))
    return 1.0


def group_lrs(cfg: dict[str, Any], epoch: int, followup_start: int | None = None) -> dict[str, float]:
    """Each config group's lr at ``epoch``; ``followup_start`` as in :func:`in_followup`."""
    o, f = cfg["optimizer"], cfg["followup"]
    base, mult = o["lr"], dict(o["lr_mult"])
    if in_followup(cfg, epoch, followup_start):
        if f["lr"] is not None:
            base = f["lr"]
        mult.update(f["lr_mult"])
    factor = schedule_factor(cfg, epoch)
    return {g: base * mult[g] * factor for g in GROUPS}


def build_optimizer(
    cfg: dict[str, Any],
    groups: dict[str, list[nn.Parameter]],
    linked: dict[str, tuple[list[nn.Parameter], str, float]] | None = None,
) -> torch.optim.Optimizer:
    """One optimizer group per non-empty entry of ``groups``; a linked group (``linked_groups``)
    carries its ``lr_of`` group and ``lr_ratio``, which ``set_lrs`` applies."""
    o = cfg["optimizer"]
    links = {name: {"lr_of": group, "lr_ratio": ratio} for name, (_, group, ratio) in (linked or {}).items()}
    param_groups = [
        {
            "name": g,
            "params": params,
            "weight_decay": o["weight_decay"] * o["wd_mult"][base_group(g)],
            **links.get(g, {}),
        }
        for g, params in groups.items()
        if params
    ]
    set_lrs_of(param_groups, group_lrs(cfg, 1))
    kw: dict[str, Any] = {}
    if o["eps"] is not None:
        kw["eps"] = o["eps"]
    name = o["name"]
    if name == "adam":
        return torch.optim.Adam(param_groups, lr=o["lr"], betas=tuple(o["betas"]), **kw)
    if name == "adamw":
        return torch.optim.AdamW(param_groups, lr=o["lr"], betas=tuple(o["betas"]), **kw)
    if name == "rmsprop":
        return torch.optim.RMSprop(param_groups, lr=o["lr"], alpha=o["alpha"], momentum=o["momentum"], **kw)
    if name == "sgd":
        return torch.optim.SGD(param_groups, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"])
    raise AssertionError(name)  # resolve_run_config checked the name


def set_lrs_of(param_groups: list[dict[str, Any]], lrs: dict[str, float]) -> None:
    for group in param_groups:
        group["lr"] = lrs[group["lr_of"]] * group["lr_ratio"] if "lr_of" in group else lrs[group["name"]]


def set_lrs(optimizer: torch.optim.Optimizer, lrs: dict[str, float]) -> None:
    """Each group's lr from the config groups' ``lrs`` (``group_lrs``)."""
    set_lrs_of(optimizer.param_groups, lrs)


def _bn_affine_ids(model: nn.Module) -> set[int]:
    ids = set()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            ids.update(id(p) for p in (m.weight, m.bias) if p is not None)
    return ids


def apply_trainability(cfg: dict[str, Any], model: nn.Module, loss: nn.Module, epoch: int) -> None:
    """``requires_grad`` of every parameter at ``epoch``: the backbone is frozen during the
    warm-up epochs (Proxy-Anchor ``--warm``); BN affine parameters stay frozen with
    ``bn_freeze.affine`` (until the end of warm-up if ``unfreeze_affine_after_warmup``)."""
    warm = epoch <= cfg["warmup_epochs"]
    bn = cfg["bn_freeze"]
    affine_frozen = bn["affine"] and not (bn["unfreeze_affine_after_warmup"] and not warm)
    bn_ids = _bn_affine_ids(model) if affine_frozen else set()
    backbone_ids = {id(p) for p in model.backbone.parameters()}
    for p in model.parameters():
        p.requires_grad_(not (warm and id(p) in backbone_ids) and id(p) not in bn_ids)
    for p in loss.parameters():
        p.requires_grad_(True)
