"""The ImageNet stand-in's recipe (docs/miniature.md): its defaults and checks, its content hash,
where its weights live, and which runs fine-tune from it (the workflow's inputs and config).

Without torch: the Snakefile and the run-config resolution import it; ``dmlrepro.models.standin``
pretrains and loads the weights. The logic is ``dmlrepro.trunk_recipe``'s, shared with the digit trunk.
"""

from __future__ import annotations

from typing import Any

from dmlrepro.trunk_recipe import TrunkRecipe

#: The pretraining recipe: generated classes (``dmlrepro.data.synthetic`` parameters), softmax
#: classification with Adam and a cosine schedule, random crops (zero padding) and flips. Families of
#: one class: the stand-in is never told classes apart by the marker that separates the classes of a
#: run's family (generic, as ImageNet is for CUB; docs/models.md#the-generated-stand-in).
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


class StandinError(ValueError):
    """A bad recipe or a weights file that does not match its recipe."""


STANDIN = TrunkRecipe(
    "standin",
    "stand-in",
    "standin",
    RECIPE_DEFAULTS,
    StandinError,
    integers={"epochs": 1, "batch_size": 1, "seed": 0, "pad": 0},
    nested=("classes",),
)
