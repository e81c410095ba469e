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

import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from dmlrepro.atomic import atomic_open
from dmlrepro.data.synthetic import render_classes
from dmlrepro.standin_recipe import StandinError, recipe_hash, resolve_recipe, weights_file

from .backbones import create_backbone, get_backbone_spec

__all__ = ["PRETRAIN_THREADS", "pretrain", "load_standin", "main"]

#: torch threads of every pretraining, whatever the job's allocation: the weights depend on the
#: thread count (the default's trunk: 4 of 24 tensors equal on 1 thread vs 2, docs/miniature.md)
PRETRAIN_THREADS = 2


# -- pretraining -------------------------------------------------------------------------------
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


def _normalise(batch: torch.Tensor, input_config: Mapping[str, Any]) -> torch.Tensor:
    mean = torch.tensor(input_config["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(input_config["std"]).view(1, 3, 1, 1)
    return (batch.float() / 255.0 - mean) / std


def pretrain(recipe: Mapping[str, Any] | None, out: str | os.PathLike, log=print) -> dict[str, Any]:
    """Train the recipe's trunk with a linear softmax classifier on its generated classes; write
    ``{"recipe", "hash", "trunk", "train_accuracy"}`` to ``out`` (a torch file), always on
    ``PRETRAIN_THREADS`` torch threads (the caller's count restored after). Returns the summary."""
    r = resolve_recipe(recipe)
    before = torch.get_num_threads()
    torch.set_num_threads(PRETRAIN_THREADS)
    try:
        trunk, accuracy = _train_trunk(r, log)
    finally:
        torch.set_num_threads(before)
    summary = {"recipe": r, "hash": recipe_hash(r), "train_accuracy": accuracy}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(out, "wb") as f:
        torch.save({**summary, "trunk": trunk.state_dict()}, f)
    return summary


def _train_trunk(r: dict[str, Any], log) -> tuple[nn.Module, float]:
    """The trained trunk and its last epoch's train accuracy (Adam, cosine schedule, crops and flips)."""
    torch.manual_seed(r["seed"])
    gen = torch.Generator().manual_seed(r["seed"])
    images, labels = _images(r)
    trunk = create_backbone(r["backbone"], **r["backbone_kwargs"])
    input_config = get_backbone_spec(r["backbone"]).input_config
    classifier = nn.Linear(int(trunk.num_features), r["classes"]["num_classes"])
    params = list(trunk.parameters()) + list(classifier.parameters())
    opt = torch.optim.Adam(params, lr=r["lr"], weight_decay=r["weight_decay"])
    steps = r["epochs"] * math.ceil(len(labels) / r["batch_size"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    trunk.train()
    for epoch in range(r["epochs"]):
        order, correct = torch.randperm(len(labels), generator=gen), 0
        for start in range(0, len(labels), r["batch_size"]):
            idx = order[start : start + r["batch_size"]]
            x = _normalise(_augment(images[idx], r["pad"], r["hflip"], gen), input_config)
            logits = classifier(trunk(x))
            loss = F.cross_entropy(logits, labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            correct += int((logits.argmax(1) == labels[idx]).sum())
        log(f"standin epoch {epoch + 1}/{r['epochs']}: train accuracy {correct / len(labels):.4f}")
    return trunk, correct / len(labels)


# -- loading -----------------------------------------------------------------------------------
def load_standin(
    model: nn.Module,
    recipe: Mapping[str, Any] | None,
    folder: str | os.PathLike,
    backbone_kwargs: Mapping[str, Any] | None = None,
) -> Path:
    """Load the stand-in trunk of ``recipe`` from ``folder`` into ``model.backbone``, built with
    ``backbone_kwargs`` (the run's, which must be the recipe's); the file must hold the same recipe
    (and hash) it is named after."""
    path = weights_file(folder, recipe)
    if not path.is_file():
        raise StandinError(
            f"stand-in weights {path} not found: the workflow's rule pretrain_standin builds them "
            f"(or `python -m dmlrepro.models.standin RECIPE.yaml {Path(folder)}`)"
        )
    resolved = resolve_recipe(recipe)
    load_checked_trunk(model, path, resolved, recipe_hash(resolved), backbone_kwargs, StandinError, "stand-in trunk")
    return path


def load_checked_trunk(
    model: nn.Module,
    path: Path,
    resolved: Mapping[str, Any],
    digest: str,
    backbone_kwargs: Mapping[str, Any] | None,
    error: type[Exception],
    what: str,
) -> None:
    """Load a pretrained trunk's file into ``model.backbone`` once it holds the recipe ``resolved`` (hash
    ``digest``) it is named after and fits the run's backbone and ``backbone_kwargs``; else ``error``.
    Shared by the stand-in and the digit trunk (models/digit_trunk.py)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("hash") != digest or state.get("recipe") != resolved:
        raise error(f"{path}: trained from recipe {state.get('recipe')}, not {resolved}")
    if resolved["backbone"] != getattr(model, "backbone_name", None):
        raise error(f"{what} {resolved['backbone']!r} does not fit backbone {getattr(model, 'backbone_name', None)!r}")
    if dict(backbone_kwargs or {}) != resolved["backbone_kwargs"]:
        raise error(
            f"{what} built with backbone_kwargs {resolved['backbone_kwargs']}; "
            f"the run's model.backbone_kwargs are {dict(backbone_kwargs or {})}: set them equal"
        )
    model.backbone.load_state_dict(state["trunk"])


def main(argv: list[str] | None = None) -> int:
    """``python -m dmlrepro.models.standin RECIPE.yaml FOLDER``: pretrain into FOLDER/standin-<hash>.pt."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    recipe = yaml.safe_load(Path(args[0]).read_text()) or {}
    print(pretrain(recipe, weights_file(args[1], recipe))["hash"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
