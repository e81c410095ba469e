"""Pretraining a trunk by softmax classification, and loading it into a run's model: the one loop and
the one check-and-load of the ImageNet stand-in (``dmlrepro.models.standin``) and the digit trunk
(``dmlrepro.models.digit_trunk``). Each brings its images and its batch transform; the recipe
(``dmlrepro.trunk_recipe``) is the whole identity of the weights, stored in the file beside them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dmlrepro.atomic import atomic_open
from dmlrepro.trunk_recipe import TrunkRecipe

from .backbones import create_backbone, get_backbone_spec

#: torch threads of every pretraining, whatever the job's allocation: the weights depend on the
#: thread count (the default's trunk: 4 of 24 tensors equal on 1 thread vs 2, docs/miniature.md)
PRETRAIN_THREADS = 2

#: a batch's uint8 images and the pretraining's generator -> the uint8 images the trunk sees
BatchTransform = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def normalise(batch: torch.Tensor, input_config: Mapping[str, Any]) -> torch.Tensor:
    """uint8 (n, 3, h, w) -> the backbone's normalised float input."""
    mean = torch.tensor(input_config["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(input_config["std"]).view(1, 3, 1, 1)
    return (batch.float() / 255.0 - mean) / std


def pretrain_to(
    out: str | os.PathLike,
    spec: TrunkRecipe,
    recipe: dict[str, Any],
    data: tuple[torch.Tensor, torch.Tensor, int],
    transform: BatchTransform,
    log=print,
) -> dict[str, Any]:
    """Train the resolved ``recipe``'s trunk on ``data`` (uint8 images, int64 labels, the number of
    classes) on ``PRETRAIN_THREADS`` torch threads (the caller's count restored after); write
    ``{"recipe", "hash", "trunk", "train_accuracy"}`` to ``out`` atomically. Returns the summary
    (without the trunk)."""
    before = torch.get_num_threads()
    torch.set_num_threads(PRETRAIN_THREADS)
    try:
        trunk, accuracy = train_trunk(recipe, *data, transform, log, what=spec.title)
    finally:
        torch.set_num_threads(before)
    summary = {"recipe": recipe, "hash": spec.hash(recipe), "train_accuracy": accuracy}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(out, "wb") as f:
        torch.save({**summary, "trunk": trunk.state_dict()}, f)
    return summary


def train_trunk(
    r: Mapping[str, Any],
    images: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    transform: BatchTransform,
    log,
    what: str,
) -> tuple[nn.Module, float]:
    """The trunk trained with a linear softmax classifier of ``num_classes`` classes (Adam, cosine schedule;
    ``transform`` draws each batch's augmentation from the recipe's seeded generator), and its last
    epoch's train accuracy."""
    torch.manual_seed(r["seed"])
    gen = torch.Generator().manual_seed(r["seed"])
    trunk = create_backbone(r["backbone"], **r["backbone_kwargs"])
    input_config = get_backbone_spec(r["backbone"]).input_config
    classifier = nn.Linear(int(trunk.num_features), num_classes)
    params = list(trunk.parameters()) + list(classifier.parameters())
    opt = torch.optim.Adam(params, lr=r["lr"], weight_decay=r["weight_decay"])
    steps = r["epochs"] * math.ceil(len(labels) / r["batch_size"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    trunk.train()
    for epoch in range(r["epochs"]):
        order, correct = torch.randperm(len(labels), generator=gen), 0
        for start in range(0, len(labels), r["batch_size"]):
            idx = order[start : start + r["batch_size"]]
            logits = classifier(trunk(normalise(transform(images[idx], gen), input_config)))
            loss = F.cross_entropy(logits, labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            correct += int((logits.argmax(1) == labels[idx]).sum())
        log(f"{what} epoch {epoch + 1}/{r['epochs']}: train accuracy {correct / len(labels):.4f}")
    return trunk, correct / len(labels)


def load_trunk(
    model: nn.Module,
    spec: TrunkRecipe,
    recipe: Mapping[str, Any] | None,
    folder: str | os.PathLike,
    backbone_kwargs: Mapping[str, Any] | None,
    missing: str,
) -> Path:
    """Load the trunk of ``recipe`` from ``folder`` into ``model.backbone`` once the file holds the recipe
    (and hash) it is named after and fits the run's backbone and ``backbone_kwargs``; else ``spec.error``
    (``missing``: what builds an absent file)."""
    path = spec.weights_file(folder, recipe)
    if not path.is_file():
        raise spec.error(f"{spec.title} weights {path} not found: {missing}")
    resolved = spec.resolve(recipe)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("hash") != spec.hash(resolved) or state.get("recipe") != resolved:
        raise spec.error(f"{path}: trained from recipe {state.get('recipe')}, not {resolved}")
    if resolved["backbone"] != getattr(model, "backbone_name", None):
        raise spec.error(
            f"{spec.title} {resolved['backbone']!r} does not fit backbone {getattr(model, 'backbone_name', None)!r}"
        )
    if dict(backbone_kwargs or {}) != resolved["backbone_kwargs"]:
        raise spec.error(
            f"{spec.title} built with backbone_kwargs {resolved['backbone_kwargs']}; "
            f"the run's model.backbone_kwargs are {dict(backbone_kwargs or {})}: set them equal"
        )
    model.backbone.load_state_dict(state["trunk"])
    return path
