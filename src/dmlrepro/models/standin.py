"""The ImageNet stand-in: the miniature's backbone pretrained once by softmax classification.

The papers fine-tune ImageNet-pretrained trunks (PFML Sec. 4.1, RSW Sec. IV-B, ASAP App. A.2); the
miniature's stand-in pretrains ``tiny_cnn`` on generated classes that no miniature run trains or
tests on (another generator seed of ``dmlrepro.data.synthetic``: disjoint class keys), and every
miniature run with ``model.pretrained: standin`` starts from its trunk (docs/miniature.md).

The recipe (``dmlrepro.standin_recipe``: ``RECIPE_DEFAULTS``, overridden by a run's
``model.standin``) is the whole identity of the weights: the file is content-addressed by its hash
(``standin-<hash>.pt`` in the weights folder), it stores the recipe it was trained from, and loading
checks both. A run's ``model.standin`` is part of its run id; the folder (``model.weights_cache_dir``) is not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from dmlrepro.data.synthetic import render_classes
from dmlrepro.standin_recipe import STANDIN

from .pretraining import PRETRAIN_THREADS, load_trunk, pretrain_to

__all__ = ["PRETRAIN_THREADS", "pretrain", "load_standin", "main"]


def _images(recipe: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = render_classes(**recipe["classes"])
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels).long()


def _augment(batch: torch.Tensor, pad: int, hflip: float, gen: torch.Generator) -> torch.Tensor:
    """Random crops of the zero-padded images and horizontal flips, per image."""
    n, _, h, w = batch.shape
    padded = F.pad(batch, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen).tolist()
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen).tolist()
    out = torch.stack([padded[i, :, y : y + h, x : x + w] for i, (y, x) in enumerate(zip(dy, dx))])
    flip = torch.rand(n, generator=gen) < hflip
    out[flip] = out[flip].flip(-1)
    return out


def pretrain(recipe: Mapping[str, Any] | None, out: str | os.PathLike, log=print) -> dict[str, Any]:
    """Train the recipe's trunk with a linear softmax classifier on its generated classes, with random
    crops and flips; write the weights to ``out`` (``dmlrepro.models.pretraining.pretrain_to``). Returns the summary."""
    r = STANDIN.resolve(recipe)
    images, labels = _images(r)
    data = (images, labels, r["classes"]["num_classes"])
    return pretrain_to(out, STANDIN, r, data, lambda batch, gen: _augment(batch, r["pad"], r["hflip"], gen), log)


def load_standin(
    model: nn.Module,
    recipe: Mapping[str, Any] | None,
    folder: str | os.PathLike,
    backbone_kwargs: Mapping[str, Any] | None = None,
) -> Path:
    """Load the stand-in trunk of ``recipe`` from ``folder`` into ``model.backbone``, built with
    ``backbone_kwargs`` (the run's, which must be the recipe's); the file must hold the same recipe
    (and hash) it is named after."""
    command = f"python -m dmlrepro.models.standin RECIPE.yaml {Path(folder)}"
    missing = f"the workflow's rule pretrain_standin builds them (or `{command}`)"
    return load_trunk(model, STANDIN, recipe, folder, backbone_kwargs, missing)


def main(argv: list[str] | None = None) -> int:
    """``python -m dmlrepro.models.standin RECIPE.yaml FOLDER``: pretrain into FOLDER/standin-<hash>.pt."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    recipe = yaml.safe_load(Path(args[0]).read_text()) or {}
    print(pretrain(recipe, STANDIN.weights_file(args[1], recipe))["hash"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
