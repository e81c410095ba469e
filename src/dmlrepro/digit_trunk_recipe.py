"""The digit-pretrained trunk's recipe (docs/models.md#the-digit-pretrained-trunk): its defaults and
checks, its content hash, where its weights live, and which runs fine-tune from it.

Without torch, like :mod:`dmlrepro.standin_recipe`: the Snakefile imports it; ``dmlrepro.models.digit_trunk``
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

from dmlrepro.data.multidigit import SPECS

#: Softmax classification of single training digits (the pool the dataset's training and validation
#: classes draw from), each on the dataset's canvas at a random place, resized to ``size`` px (the
#: runs' input size); Adam with a cosine schedule. ``dataset`` names the multi-digit dataset whose
#: training digits and canvas are used (its prepared folder is read for MNIST's).
RECIPE_DEFAULTS: dict[str, Any] = {
    "dataset": "double_digits",
    "backbone": "tiny_cnn",
    "backbone_kwargs": {},
    "size": 32,
    "digits_per_class": None,  # the first N training images of each digit (file order); None: all
    "epochs": 30,
    "batch_size": 128,
    "lr": 2.0e-3,
    "weight_decay": 5.0e-4,
    "seed": 0,
}
HASH_LENGTH = 12
PREFIX = "digits"  # the weights file's name: digits-<hash>.pt
#: ``model.pretrained`` of the runs that fine-tune from the trunk; ``model.digit_trunk`` holds their recipe
PRETRAINED = "digit_trunk"


class DigitTrunkError(ValueError):
    """A bad recipe or a weights file that does not match its recipe."""


def resolve_recipe(recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``RECIPE_DEFAULTS`` with ``recipe`` merged in; unknown keys or values raise."""
    out = copy.deepcopy(RECIPE_DEFAULTS)
    for key, value in (recipe or {}).items():
        if key not in out:
            raise DigitTrunkError(f"model.digit_trunk: unknown key {key!r}; expected one of {sorted(out)}")
        out[key] = value
    if out["dataset"] not in SPECS:
        raise DigitTrunkError(f"model.digit_trunk.dataset = {out['dataset']!r}: expected one of {sorted(SPECS)}")
    if not isinstance(out["backbone_kwargs"], Mapping):
        raise DigitTrunkError(f"model.digit_trunk.backbone_kwargs = {out['backbone_kwargs']!r}: expected a mapping")
    out["backbone_kwargs"] = dict(out["backbone_kwargs"])
    for key in ("size", "digits_per_class", "epochs", "batch_size", "seed"):
        low = 0 if key == "seed" else 1
        if key == "digits_per_class" and out[key] is None:
            continue
        if isinstance(out[key], bool) or not isinstance(out[key], int) or out[key] < low:
            raise DigitTrunkError(f"model.digit_trunk.{key} = {out[key]!r}: expected an integer >= {low}")
    return out


def recipe_hash(recipe: Mapping[str, Any] | None = None) -> str:
    """The first ``HASH_LENGTH`` hex digits of the sha256 of the resolved recipe's canonical JSON."""
    text = json.dumps(resolve_recipe(recipe), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def weights_file(folder: str | os.PathLike, recipe: Mapping[str, Any] | None = None) -> Path:
    """Where the weights of ``recipe`` live: ``<folder>/digits-<hash>.pt``."""
    return weights_file_of_hash(folder, recipe_hash(recipe))


def weights_file_of_hash(folder: str | os.PathLike, digest: str) -> Path:
    """The one spelling of the trunk's weights path (``digest``: a recipe's hash or a Snakemake wildcard)."""
    return Path(folder) / f"{PREFIX}-{digest}.pt"


def _recipe_of(config: Mapping[str, Any]) -> dict[str, Any] | None:
    model = config.get("model") or {}
    return resolve_recipe(model.get("digit_trunk")) if model.get("pretrained") == PRETRAINED else None


def workflow_recipes(runs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Recipe hash -> recipe of every run (objects with a resolved ``config``) that fine-tunes from the trunk."""
    recipes = (_recipe_of(run.config) for run in runs.values())
    return {recipe_hash(r): r for r in recipes if r is not None}


def run_weights(config: Mapping[str, Any], folder: str | os.PathLike) -> list[str]:
    """The trunk's weights file a run config starts from (``[]`` for the others): a job's input."""
    recipe = _recipe_of(config)
    return [] if recipe is None else [str(weights_file(folder, recipe))]


def with_folder(config: Mapping[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
    """``config`` with ``model.weights_cache_dir = folder`` if it fine-tunes from the trunk (a location
    key, not part of the run id); other configs unchanged."""
    if _recipe_of(config) is None:
        return dict(config)
    return {**config, "model": {**config["model"], "weights_cache_dir": str(folder)}}


def prepared_inputs(recipe: Mapping[str, Any]) -> list[str]:
    """The datasets a recipe's pretraining reads prepared: MNIST's digits come from the prepared multi-digit
    set (its manifest is the rule's input); scikit-learn's bundled digits need none."""
    dataset = recipe["dataset"]
    return [dataset] if SPECS[dataset].source == "mnist" else []
