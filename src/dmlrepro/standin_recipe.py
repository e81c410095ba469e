"""The ImageNet stand-in's recipe (docs/miniature.md): its defaults and checks, its content hash,
where its weights live, and which runs fine-tune from it (the workflow's inputs and config).

Without torch: the Snakefile and the run-config resolution import it; ``dmlrepro.models.standin``
pretrains and loads the weights.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The pretraining recipe: generated classes (``dmlrepro.data.synthetic`` parameters), softmax
#: classification with Adam and a cosine schedule, random crops (zero padding) and flips. Families of
#: one class: the stand-in is never told classes apart by the marker that separates the classes of a
#: run's family (generic, as ImageNet is for CUB; docs/miniature.md#the-imagenet-stand-in).
RECIPE_DEFAULTS: dict[str, Any] = {
    "backbone": "tiny_cnn",
    "backbone_kwargs": {},
    "classes": {"seed": 1, "num_classes": 256, "images_per_class": 32, "size": 32, "modes": 2, "family_size": 1},
    "epochs": 24,
    "batch_size": 128,
    "lr": 4.0e-3,
    "weight_decay": 5.0e-4,
    "pad": 4,
    "hflip": 0.5,
    "seed": 0,
}
HASH_LENGTH = 12


class StandinError(ValueError):
    """A bad recipe or a weights file that does not match its recipe."""


def resolve_recipe(recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``RECIPE_DEFAULTS`` with ``recipe`` merged in (``classes`` key by key); unknown keys raise."""
    out = copy.deepcopy(RECIPE_DEFAULTS)
    for key, value in (recipe or {}).items():
        if key not in out:
            raise StandinError(f"model.standin: unknown key {key!r}; expected one of {sorted(out)}")
        if key == "classes":
            bad = sorted(set(value or {}) - set(out["classes"]))
            if bad:
                raise StandinError(f"model.standin.classes: unknown key(s) {bad}; expected {sorted(out['classes'])}")
            out["classes"].update(value or {})
        else:
            out[key] = value
    if not isinstance(out["backbone_kwargs"], Mapping):
        raise StandinError(f"model.standin.backbone_kwargs = {out['backbone_kwargs']!r}: expected a mapping")
    out["backbone_kwargs"] = dict(out["backbone_kwargs"])
    for key in ("epochs", "batch_size", "seed", "pad"):
        if (
            isinstance(out[key], bool)
            or not isinstance(out[key], int)
            or out[key] < (0 if key in ("seed", "pad") else 1)
        ):
            raise StandinError(
                f"model.standin.{key} = {out[key]!r}: expected an integer >= {0 if key in ('seed', 'pad') else 1}"
            )
    return out


def recipe_hash(recipe: Mapping[str, Any] | None = None) -> str:
    """The first ``HASH_LENGTH`` hex digits of the sha256 of the resolved recipe's canonical JSON."""
    text = json.dumps(resolve_recipe(recipe), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def weights_file(folder: str | os.PathLike, recipe: Mapping[str, Any] | None = None) -> Path:
    """Where the weights of ``recipe`` live: ``<folder>/standin-<hash>.pt``."""
    return weights_file_of_hash(folder, recipe_hash(recipe))


def weights_file_of_hash(folder: str | os.PathLike, digest: str) -> Path:
    """The one spelling of a stand-in's weights path (``digest``: a recipe's hash, or a Snakemake
    wildcard: rule pretrain_standin's output)."""
    return Path(folder) / f"standin-{digest}.pt"


def _recipe_of(config: Mapping[str, Any]) -> dict[str, Any] | None:
    model = config.get("model") or {}
    return resolve_recipe(model.get("standin")) if model.get("pretrained") == "standin" else None


def workflow_recipes(runs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Recipe hash -> recipe of every run (objects with a resolved ``config``) that fine-tunes from the stand-in."""
    recipes = (_recipe_of(run.config) for run in runs.values())
    return {recipe_hash(r): r for r in recipes if r is not None}


def run_weights(config: Mapping[str, Any], folder: str | os.PathLike) -> list[str]:
    """The stand-in weights file a run config starts from (``[]`` for the others): a job's input."""
    recipe = _recipe_of(config)
    return [] if recipe is None else [str(weights_file(folder, recipe))]


def with_folder(config: Mapping[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
    """``config`` with ``model.weights_cache_dir = folder`` if it fine-tunes from the stand-in (a
    location key, not part of the run id); other configs unchanged."""
    if _recipe_of(config) is None:
        return dict(config)
    return {**config, "model": {**config["model"], "weights_cache_dir": str(folder)}}
