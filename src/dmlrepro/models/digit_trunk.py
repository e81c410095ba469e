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

from dmlrepro.data.multidigit import SPECS, training_digits
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK

from .pretraining import load_trunk, pretrain_to

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
    """Train the recipe's trunk with a linear softmax classifier of the 10 digits, each placed at random
    on the dataset's canvas; write the weights to ``out`` (``pretraining.pretrain_to``). Returns the summary."""
    r = DIGIT_TRUNK.resolve(recipe)
    images, labels = training_digits(r["dataset"], data_root)
    if r["digits_per_class"] is not None:
        keep = np.sort(np.concatenate([np.flatnonzero(labels == d)[: r["digits_per_class"]] for d in range(10)]))
        images, labels = images[keep], labels[keep]
    canvas = SPECS[r["dataset"]].canvas
    data = (torch.from_numpy(images), torch.from_numpy(labels), 10)
    return pretrain_to(out, DIGIT_TRUNK, r, data, lambda batch, gen: place_digits(batch, canvas, r["size"], gen), log)


def load_digit_trunk(
    model: nn.Module,
    recipe: Mapping[str, Any] | None,
    folder: str | os.PathLike,
    backbone_kwargs: Mapping[str, Any] | None = None,
) -> Path:
    """Load the trunk of ``recipe`` from ``folder`` into ``model.backbone`` (built with the run's
    ``backbone_kwargs``, which must be the recipe's); the file must hold the recipe it is named after."""
    missing = f"`python -m dmlrepro.models.digit_trunk RECIPE.yaml {Path(folder)} DATA_ROOT` builds them"
    return load_trunk(model, DIGIT_TRUNK, recipe, folder, backbone_kwargs, missing)


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
