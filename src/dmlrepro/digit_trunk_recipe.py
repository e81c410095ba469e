"""The digit-pretrained trunk's recipe (docs/models.md#the-digit-pretrained-trunk): its defaults and
checks, its content hash, where its weights live, and which runs fine-tune from it.

Without torch, like :mod:`dmlrepro.standin_recipe` and with its logic (``dmlrepro.trunk_recipe``): the
Snakefile imports it; ``dmlrepro.models.digit_trunk`` pretrains and loads the weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dmlrepro.data.multidigit import SPECS
from dmlrepro.trunk_recipe import TrunkRecipe

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
PREFIX = "digits"  # the weights file's name: digits-<hash>.pt
#: ``model.pretrained`` of the runs that fine-tune from the trunk; ``model.digit_trunk`` holds their recipe
PRETRAINED = "digit_trunk"


class DigitTrunkError(ValueError):
    """A bad recipe or a weights file that does not match its recipe."""


def _check_dataset(recipe: dict[str, Any]) -> None:
    if recipe["dataset"] not in SPECS:
        raise DigitTrunkError(f"model.digit_trunk.dataset = {recipe['dataset']!r}: expected one of {sorted(SPECS)}")


DIGIT_TRUNK = TrunkRecipe(
    PRETRAINED,
    "digit trunk",
    PREFIX,
    RECIPE_DEFAULTS,
    DigitTrunkError,
    integers={"size": 1, "digits_per_class": 1, "epochs": 1, "batch_size": 1, "seed": 0},
    nullable=frozenset({"digits_per_class"}),
    check=_check_dataset,
)


def prepared_inputs(recipe: Mapping[str, Any]) -> list[str]:
    """The datasets a recipe's pretraining reads prepared: MNIST's digits come from the prepared multi-digit
    set (its manifest is the rule's input); scikit-learn's bundled digits need none."""
    dataset = recipe["dataset"]
    return [dataset] if SPECS[dataset].source == "mnist" else []
