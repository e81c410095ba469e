"""Adapter from the run config's ``model`` / ``loss`` sections to ``dmlrepro.models`` and
``dmlrepro.losses`` (BN freezing is applied by the engine, not by ``build_model``)."""

from __future__ import annotations

from typing import Any

from torch import nn

from dmlrepro.losses import build_loss
from dmlrepro.models import MODEL_KEYS, build_model, freeze_batchnorm


def build_run_model(cfg: dict[str, Any]) -> nn.Module:
    kwargs = {k: v for k, v in cfg["model"].items() if v is not None and k in MODEL_KEYS}
    if not kwargs.get("backbone_kwargs"):
        kwargs.pop("backbone_kwargs", None)
    model = build_model(kwargs)
    if cfg["bn_freeze"]["running_stats"]:
        freeze_batchnorm(model, running_stats=True, affine=False)
    return model


def build_run_loss(cfg: dict[str, Any], num_classes: int, embedding_size: int) -> nn.Module:
    return build_loss(cfg["loss"]["name"], num_classes, embedding_size, **dict(cfg["loss"]["hparams"]))
