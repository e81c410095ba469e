"""Data layer: dataset registry and preparation, manifests, splits, label noise, samplers,
transforms, corruptions and the torch Dataset. See docs/data.md.

Light names are imported here; the torch-dependent ones load on first access.
"""

from __future__ import annotations

import importlib

from .manifest import Manifest, ManifestError, read_manifest, write_manifest
from .registry import DATASETS, load, prepare
from .splits import holdout_split, kfold_class_splits, sample_holdout, split_indices, standard_split

_LAZY = {
    "ManifestDataset": "dataset",
    "load_image": "dataset",
    "RandomBatchSampler": "samplers",
    "MPerClassBatchSampler": "samplers",
    "build_transform": "transforms",
    "normalize_transform": "transforms",
    "build_corruption": "corruptions",
    "CORRUPTIONS": "corruptions",
    "corrupt_labels": "label_noise",
    "write_noisy_labels": "label_noise",
    "read_noisy_labels": "label_noise",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DATASETS",
    "Manifest",
    "ManifestError",
    "load",
    "prepare",
    "read_manifest",
    "write_manifest",
    "standard_split",
    "kfold_class_splits",
    "holdout_split",
    "sample_holdout",
    "split_indices",
    *_LAZY,
]
