"""The digit-pretrained trunk: the ImageNet stand-in of the multi-digit datasets (docs/models.md).

The papers fine-tune ImageNet-pretrained trunks (PFML Sec. 4.1, RSW Sec. IV-B, ASAP App. A.2) on
classes ImageNet never named. Here the trunk learns to classify *single* digits, the training
digits only (``dmlrepro.data.multidigit.training_digits``: never a digit image of the test
classes), each at a random place on the dataset's canvas and resized to the runs' input size: it
knows strokes and digits but not the composite classes, nor (with global pooling) their order, as
ImageNet knows parts but not bird species.

The recipe (``dmlrepro.digit_trunk_recipe``) is the whole identity of the weights: the file is
content-addressed by its hash (``digits-<hash>.pt``), stores the recipe it was trained from, and
loading checks both, as for the generated stand-in (``dmlrepro.models.standin``).
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
from dmlrepro.digit_trunk_recipe import DigitTrunkError, recipe_hash, resolve_recipe, weights_file

from .backbones import create_backbone, get_backbone_spec
from .standin import PRETRAIN_THREADS, _normalise, load_checked_trunk

__all__ = ["pretrain", "load_digit_trunk", "place_digits", "main"]


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


def pretrain(
    recipe: Mapping[str, Any] | None, out: str | os.PathLike, data_root: str | os.PathLike | None = None, log=print
) -> dict[str, Any]:
    """Train the recipe's trunk with a linear softmax classifier of the 10 digits; write
    ``{"recipe", "hash", "trunk", "train_accuracy"}`` to ``out``, on ``PRETRAIN_THREADS`` torch threads."""
    r = resolve_recipe(recipe)
    images, labels = training_digits(r["dataset"], data_root)
    if r["digits_per_class"] is not None:
        keep = np.concatenate([np.flatnonzero(labels == d)[: r["digits_per_class"]] for d in range(10)])
        images, labels = images[np.sort(keep)], labels[np.sort(keep)]
    before = torch.get_num_threads()
    torch.set_num_threads(PRETRAIN_THREADS)
    try:
        trunk, accuracy = _train(r, torch.from_numpy(images), torch.from_numpy(labels), log)
    finally:
        torch.set_num_threads(before)
    summary = {"recipe": r, "hash": recipe_hash(r), "train_accuracy": accuracy}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(out, "wb") as f:
        torch.save({**summary, "trunk": trunk.state_dict()}, f)
    return summary


def _train(r: dict[str, Any], images: torch.Tensor, labels: torch.Tensor, log) -> tuple[nn.Module, float]:
    """The trained trunk and its last epoch's train accuracy (Adam, cosine schedule)."""
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
            x = _normalise(place_digits(images[idx], canvas, r["size"], gen), input_config)
            logits = classifier(trunk(x))
            loss = F.cross_entropy(logits, labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            correct += int((logits.argmax(1) == labels[idx]).sum())
        log(f"digit trunk epoch {epoch + 1}/{r['epochs']}: train accuracy {correct / len(labels):.4f}")
    return trunk, correct / len(labels)


def load_digit_trunk(
    model: nn.Module,
    recipe: Mapping[str, Any] | None,
    folder: str | os.PathLike,
    backbone_kwargs: Mapping[str, Any] | None = None,
) -> Path:
    """Load the trunk of ``recipe`` from ``folder`` into ``model.backbone`` (built with the run's
    ``backbone_kwargs``, which must be the recipe's); the file must hold the recipe it is named after."""
    path = weights_file(folder, recipe)
    if not path.is_file():
        raise DigitTrunkError(
            f"digit trunk weights {path} not found: `python -m dmlrepro.models.digit_trunk RECIPE.yaml "
            f"{Path(folder)} DATA_ROOT` builds them"
        )
    resolved = resolve_recipe(recipe)
    load_checked_trunk(model, path, resolved, recipe_hash(resolved), backbone_kwargs, DigitTrunkError, "digit trunk")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m dmlrepro.models.digit_trunk RECIPE.yaml FOLDER [DATA_ROOT]``: pretrain into
    FOLDER/digits-<hash>.pt (DATA_ROOT holds the prepared double_mnist / triple_mnist)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print(main.__doc__, file=sys.stderr)
        return 2
    recipe = yaml.safe_load(Path(args[0]).read_text()) or {}
    print(pretrain(recipe, weights_file(args[1], recipe), args[2] if len(args) == 3 else None)["hash"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
