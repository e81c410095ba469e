"""The digit-pretrained trunk's recipe (docs/models.md#the-digit-pretrained-trunk): its defaults and
checks, its content hash, where its weights live, and which runs fine-tune from it (the workflow's
inputs and config).

Without torch: the Snakefile and the run-config resolution import it; ``dmlrepro.models.digit_trunk``
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
#: integer keys and their minimum (``digits_per_class`` may also be None)
INTEGERS = {"size": 1, "digits_per_class": 1, "epochs": 1, "batch_size": 1, "seed": 0}
PREFIX = "digits"  # the weights file's name: digits-<hash>.pt
#: ``model.pretrained`` of the runs that fine-tune from the trunk; ``model.digit_trunk`` holds their recipe
PRETRAINED = "digit_trunk"
HASH_LENGTH = 12


class DigitTrunkError(ValueError):
    """A bad recipe or a weights file that does not match its recipe."""


class DigitTrunkRecipe:
    """The recipe's operations: ``resolve`` (defaults with a run's ``model.digit_trunk`` merged in, checked),
    ``hash``, the weights' path, and the runs that fine-tune from the trunk. ``key`` is the value of
    ``model.pretrained`` that names the trunk and the run-config key holding its recipe."""

    key = PRETRAINED
    title = "digit trunk"

    def resolve(self, recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The defaults with ``recipe`` merged in; unknown keys or bad values raise ``DigitTrunkError``."""
        out = copy.deepcopy(RECIPE_DEFAULTS)
        for key, value in (recipe or {}).items():
            if key not in out:
                raise DigitTrunkError(f"model.{PRETRAINED}: unknown key {key!r}; expected one of {sorted(out)}")
            out[key] = value
        if not isinstance(out["backbone_kwargs"], Mapping):
            raise DigitTrunkError(
                f"model.{PRETRAINED}.backbone_kwargs = {out['backbone_kwargs']!r}: expected a mapping"
            )
        out["backbone_kwargs"] = dict(out["backbone_kwargs"])
        for key, low in INTEGERS.items():
            value = out[key]
            if key == "digits_per_class" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DigitTrunkError(f"model.{PRETRAINED}.{key} = {value!r}: expected an integer >= {low}")
        if out["dataset"] not in SPECS:
            raise DigitTrunkError(f"model.{PRETRAINED}.dataset = {out['dataset']!r}: expected one of {sorted(SPECS)}")
        return out

    def hash(self, recipe: Mapping[str, Any] | None = None) -> str:
        """The first ``HASH_LENGTH`` hex digits of the sha256 of the resolved recipe's canonical JSON."""
        text = json.dumps(self.resolve(recipe), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]

    def weights_file(self, folder: str | os.PathLike, recipe: Mapping[str, Any] | None = None) -> Path:
        """Where the weights of ``recipe`` live: ``<folder>/digits-<hash>.pt``."""
        return self.weights_file_of_hash(folder, self.hash(recipe))

    def weights_file_of_hash(self, folder: str | os.PathLike, digest: str) -> Path:
        """The one spelling of the weights' path (``digest``: a recipe's hash, or a Snakemake wildcard:
        the pretraining rule's output)."""
        return Path(folder) / f"{PREFIX}-{digest}.pt"

    def of_config(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """The resolved recipe a run config fine-tunes from, None when it starts from another network."""
        model = config.get("model") or {}
        return self.resolve(model.get(PRETRAINED)) if model.get("pretrained") == PRETRAINED else None

    def workflow_recipes(self, runs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Recipe hash -> recipe of every run (objects with a resolved ``config``) that fine-tunes from the trunk."""
        recipes = (self.of_config(run.config) for run in runs.values())
        return {self.hash(r): r for r in recipes if r is not None}

    def run_weights(self, config: Mapping[str, Any], folder: str | os.PathLike) -> list[str]:
        """The weights file a run config starts from (``[]`` for the others): a job's input."""
        recipe = self.of_config(config)
        return [] if recipe is None else [str(self.weights_file(folder, recipe))]

    def with_folder(self, config: Mapping[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
        """``config`` with ``model.weights_cache_dir = folder`` if it fine-tunes from the trunk (a location
        key, not part of the run id); other configs unchanged."""
        if self.of_config(config) is None:
            return dict(config)
        return {**config, "model": {**config["model"], "weights_cache_dir": str(folder)}}


DIGIT_TRUNK = DigitTrunkRecipe()


def prepared_inputs(recipe: Mapping[str, Any]) -> list[str]:
    """The datasets a recipe's pretraining reads prepared: MNIST's digits come from the prepared multi-digit
    set (its manifest is the rule's input); scikit-learn's bundled digits need none."""
    dataset = recipe["dataset"]
    return [dataset] if SPECS[dataset].source == "mnist" else []
