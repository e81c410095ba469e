"""The names run-config keys choose among (``model.backbone``, ``model.pretrained``, ``loss.name``,
``asap.*``, ``eval.corruptions``, ``speed.knn_backend``) and the parser of ``eval.nmi``, without
importing torch: the Snakefile checks every run's config while it parses, and the modules that
build trunks, losses and searches import torch (seconds for every ``snakemake`` call). The
registries' names are copied here and kept equal to them by tests/config/test_config_names.py: a
backbone, weight file or corruption added there is added here too. The losses' names, config
defaults and papers are not copied: :func:`loss_catalog` reads their declarations
(dmlrepro.losses.registry) or the copy generated from them.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Mapping
from typing import Any

#: the registered trunks (``dmlrepro.models.BACKBONES``)
BACKBONE_NAMES: tuple[str, ...] = (
    "resnet50",
    "bn_inception",
    "vit_small_patch16_224",
    "dino_vits16",
    "resnet18",
    "resnet10t",
    "mobilenetv3_small_100",
    "tiny_cnn",
    "resnetv2_20",
)

#: other names used in configs for the same trunk (``dmlrepro.models.ALIASES``)
BACKBONE_ALIASES: dict[str, str] = {
    "r50": "resnet50",
    "bninception": "bn_inception",
    "ibn": "bn_inception",
    "vit_s16": "vit_small_patch16_224",
    "vit_small": "vit_small_patch16_224",
    "dino_vit_s16": "dino_vits16",
    "vit_small_patch16_224.dino": "dino_vits16",
    "resnet_v2_20": "resnetv2_20",  # ASAP's "ResNetV2-20"
    "resnet20v2": "resnetv2_20",  # Keras cifar10_resnet's model_type "ResNet20v2"
}

#: the registered pretrained weight files (``dmlrepro.models.WEIGHTS``)
WEIGHT_NAMES: tuple[str, ...] = (
    "bn_inception.imagenet",
    "resnet18.tv_in1k",
    "resnet50.tv2_in1k",
    "resnet50.tv_in1k",
    "vit_small_patch16_224.augreg_in21k",
    "vit_small_patch16_224.augreg_in21k_ft_in1k",
    "vit_small_patch16_224.dino",
)


def canonical_backbone(name: str, known: Collection[str] = BACKBONE_NAMES) -> str:
    """The canonical trunk name for ``name`` (aliases resolved) among ``known``; KeyError naming
    the known names for any other."""
    canonical = BACKBONE_ALIASES.get(name, name)
    if canonical not in known:
        names = sorted(known) + sorted(f"{a} (= {b})" for a, b in BACKBONE_ALIASES.items())
        raise KeyError(f"unknown backbone {name!r}; known: {', '.join(names)}")
    return canonical


def loss_catalog() -> tuple[dict[str, dict], dict[str, dict]]:
    """(losses, papers), read-only (dmlrepro.losses.registry.catalog): the losses' declarations where
    dmlrepro.losses is loaded in this process (a loss registered since, a test's, included), else
    their generated copy dmlrepro.loss_catalog, which imports nothing."""
    registry = sys.modules.get("dmlrepro.losses.registry")
    if registry is not None:
        return registry.catalog()
    from dmlrepro import loss_catalog  # deferred: only the config check and the presets need it

    return loss_catalog.LOSSES, loss_catalog.PAPERS


def __getattr__(name: str):
    if name == "LOSS_NAMES":  # ``loss.name``: the registered losses (``dmlrepro.losses.LOSS_NAMES``)
        return tuple(sorted(loss_catalog()[0]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: ``asap.small_budget``, ``asap.first_init`` (dmlrepro.asap.kcenter), ``asap.anchor`` (dmlrepro.asap.schedule)
SMALL_BUDGET: tuple[str, ...] = ("times_p", "clip")
FIRST_INIT: tuple[str, ...] = ("kcenter_from_random", "random", "kcenter_from_zero")
ANCHORS: tuple[str, ...] = ("best", "last")

#: ``eval.corruptions[].name``: RSW Table IV's corruptions (``dmlrepro.data.corruptions.CORRUPTIONS``)
CORRUPTION_NAMES: tuple[str, ...] = (
    "gaussian",
    "uniform",
    "salt_and_pepper",
    "dropout",
    "cutout",
    "shear",
    "jigsaw",
    "hue_saturation",
    "defocus_blur",
)

#: ``speed.knn_backend`` (dmlrepro.evaluation.knn)
KNN_BACKENDS: tuple[str, ...] = ("auto", "torch", "faiss-cpu", "faiss-gpu")

#: ``eval.nmi: true``: pytorch-metric-learning's computation (faiss, one run, arithmetic mean).
NMI_DEFAULTS: dict[str, Any] = {"average": "arithmetic", "kmeans": "faiss", "n_init": 10}
AVERAGES = ("arithmetic", "geometric")
KMEANS = ("faiss", "sklearn")


def nmi_options(value: Any) -> dict[str, Any] | None:
    """The NMI options an ``eval.nmi`` value asks for (dmlrepro.evaluation.clustering): None for
    ``false``, :data:`NMI_DEFAULTS` for ``true``, the defaults updated by a mapping (keys ``average``,
    ``kmeans``, ``n_init``; ``n_init`` counts scikit-learn's restarts). Raises ValueError on anything
    else."""
    if isinstance(value, bool):
        return dict(NMI_DEFAULTS) if value else None
    if not isinstance(value, Mapping):
        raise ValueError("true, false or a mapping with keys among " + str(sorted(NMI_DEFAULTS)))
    unknown = sorted(set(value) - set(NMI_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; expected keys among {sorted(NMI_DEFAULTS)}")
    out = {**NMI_DEFAULTS, **value}
    if out["average"] not in AVERAGES:
        raise ValueError(f"average must be one of {list(AVERAGES)}, got {out['average']!r}")
    if out["kmeans"] not in KMEANS:
        raise ValueError(f"kmeans must be one of {list(KMEANS)}, got {out['kmeans']!r}")
    n = out["n_init"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n_init must be an integer >= 1, got {n!r}")
    return out
