"""The digit-pretrained trunk: the ImageNet stand-in of the multi-digit datasets (docs/models.md).

The papers fine-tune ImageNet-pretrained trunks (PFML Sec. 4.1, RSW Sec. IV-B, ASAP App. A.2) on
classes ImageNet never named. Here the trunk learns to classify *single* digits, the training
digits only (``dmlrepro.data.multidigit.training_digits``: never a digit image of the test
classes), each at a random place on the dataset's canvas and resized to the runs' input size: it
knows strokes and digits but not the composite classes, nor (with global pooling) their order, as
ImageNet knows parts but not bird species.

The recipe (``dmlrepro.digit_trunk_recipe``) is the whole identity of the weights: the file is
content-addressed by its hash (``digits-<hash>.pt``), stores the recipe it was trained from, and
loading checks both.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from dmlrepro.atomic import atomic_open
from dmlrepro.data.multidigit import SPECS, training_digits
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK, DigitTrunkError

from .backbones import create_backbone, get_backbone_spec

__all__ = ["PRETRAIN_THREADS", "pretrain", "load_digit_trunk", "place_digits", "normalise", "main"]

#: torch threads of every pretraining, whatever the job's allocation: the weights depend on the
#: thread count (the default's trunk: 4 of 24 tensors equal on 1 thread vs 2, docs/miniature.md)
PRETRAIN_THREADS = 2


def place_digits(digits: torch.Tensor, canvas: tuple[int, int], size: int, gen: torch.Generator) -> torch.Tensor:
    """(n, 3, size, size) uint8: each (side, side) digit at a uniformly random place on a black
    canvas, resized (bilinear, antialiased, as the runs' Resize) to ``size`` px, grey to RGB."""
    n, side = len(digits), digits.shape[-1]
    h, w = canvas
    ys = torch.randint(0, h - side + 1, (n,), generator=gen).tolist()
    xs = torch.randint(0, w - side + 1, (n,), generator=gen).tolist()
    out = torch.zeros(n, 1, h, w, dtype=torch.uint8)
    for i, (y, x) in enumerate(zip(ys, xs)):
        out[i, 0, y : y + side, x : x + side] = digits[i]
    if (h, w) != (size, size):
        out = F.interpolate(out.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out = out.round().clamp(0, 255).to(torch.uint8)
    return out.expand(-1, 3, -1, -1)


def normalise(batch: torch.Tensor, input_config: Mapping[str, Any]) -> torch.Tensor:
    """uint8 (n, 3, h, w) -> the backbone's normalised float input."""
    mean = torch.tensor(input_config["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(input_config["std"]).view(1, 3, 1, 1)
    return (batch.float() / 255.0 - mean) / std


def pretrain(
    recipe: Mapping[str, Any] | None, out: str | os.PathLike, data_root: str | os.PathLike | None = None, log=print
) -> dict[str, Any]:
    """Train the recipe's trunk with a linear softmax classifier of the 10 digits, each placed at random
    on the dataset's canvas, on ``PRETRAIN_THREADS`` torch threads (the caller's count restored after);
    write ``{"recipe", "hash", "trunk", "train_accuracy"}`` to ``out`` atomically. Returns the summary
    (without the trunk)."""
    r = DIGIT_TRUNK.resolve(recipe)
    images, labels = training_digits(r["dataset"], data_root)
    if r["digits_per_class"] is not None:
        keep = np.sort(np.concatenate([np.flatnonzero(labels == d)[: r["digits_per_class"]] for d in range(10)]))
        images, labels = images[keep], labels[keep]
    before = torch.get_num_threads()
    torch.set_num_threads(PRETRAIN_THREADS)
    try:
        trunk, accuracy = train_trunk(r, torch.from_numpy(images), torch.from_numpy(labels), log)
    finally:
        torch.set_num_threads(before)
    summary = {"recipe": r, "hash": DIGIT_TRUNK.hash(r), "train_accuracy": accuracy}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(out, "wb") as f:
        torch.save({**summary, "trunk": trunk.state_dict()}, f)
    return summary


def train_trunk(r: Mapping[str, Any], images: torch.Tensor, labels: torch.Tensor, log) -> tuple[nn.Module, float]:
    """The trunk trained with a linear softmax classifier of the 10 digits (Adam, cosine schedule; each
    batch's placement drawn from the recipe's seeded generator), and its last epoch's train accuracy."""
    torch.manual_seed(r["seed"])
    gen = torch.Generator().manual_seed(r["seed"])
    canvas = SPECS[r["dataset"]].canvas
    trunk = create_backbone(r["backbone"], **r["backbone_kwargs"])
    input_config = get_backbone_spec(r["backbone"]).input_config
    classifier = nn.Linear(int(trunk.num_features), 10)
    params = list(trunk.parameters()) + list(classifier.parameters())
    opt = torch.optim.Adam(params, lr=r["lr"], weight_decay=r["weight_decay"])
    steps = r["epochs"] * math.ceil(len(labels) / r["batch_size"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    trunk.train()
    for epoch in range(r["epochs"]):
        order, correct = torch.randperm(len(labels), generator=gen), 0
        for start in range(0, len(labels), r["batch_size"]):
            idx = order[start : start + r["batch_size"]]
            batch = place_digits(images[idx], canvas, r["size"], gen)
            logits = classifier(trunk(normalise(batch, input_config)))
            loss = F.cross_entropy(logits, labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            correct += int((logits.argmax(1) == labels[idx]).sum())
        log(f"{DIGIT_TRUNK.title} epoch {epoch + 1}/{r['epochs']}: train accuracy {correct / len(labels):.4f}")
    return trunk, correct / len(labels)


def load_digit_trunk(
    model: nn.Module,
    recipe: Mapping[str, Any] | None,
    folder: str | os.PathLike,
    backbone_kwargs: Mapping[str, Any] | None = None,
) -> Path:
    """Load the trunk of ``recipe`` from ``folder`` into ``model.backbone`` once the file holds the recipe
    (and hash) it is named after and fits the run's backbone and ``backbone_kwargs`` (which must be the
    recipe's); else ``DigitTrunkError``."""
    path = DIGIT_TRUNK.weights_file(folder, recipe)
    if not path.is_file():
        command = f"python -m dmlrepro.models.digit_trunk RECIPE.yaml {Path(folder)} DATA_ROOT"
        raise DigitTrunkError(f"digit trunk weights {path} not found: `{command}` builds them")
    resolved = DIGIT_TRUNK.resolve(recipe)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("hash") != DIGIT_TRUNK.hash(resolved) or state.get("recipe") != resolved:
        raise DigitTrunkError(f"{path}: trained from recipe {state.get('recipe')}, not {resolved}")
    backbone = getattr(model, "backbone_name", None)
    if resolved["backbone"] != backbone:
        raise DigitTrunkError(f"digit trunk {resolved['backbone']!r} does not fit backbone {backbone!r}")
    if dict(backbone_kwargs or {}) != resolved["backbone_kwargs"]:
        raise DigitTrunkError(
            f"digit trunk built with backbone_kwargs {resolved['backbone_kwargs']}; "
            f"the run's model.backbone_kwargs are {dict(backbone_kwargs or {})}: set them equal"
        )
    model.backbone.load_state_dict(state["trunk"])
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m dmlrepro.models.digit_trunk RECIPE.yaml FOLDER [DATA_ROOT]``: pretrain into
    FOLDER/digits-<hash>.pt (DATA_ROOT holds the prepared double_mnist / triple_mnist)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print(main.__doc__, file=sys.stderr)
        return 2
    recipe = yaml.safe_load(Path(args[0]).read_text()) or {}
    print(pretrain(recipe, DIGIT_TRUNK.weights_file(args[1], recipe), args[2] if len(args) == 3 else None)["hash"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
