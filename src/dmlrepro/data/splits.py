"""Class-disjoint splits, and one sample-level split.

* ``standard_split``: the zero-shot protocol — first half of the sorted classes ``train``, second
  half ``test`` (PFML §4.1, RSW §IV-A; SOP instead follows Ebay_train/test.txt).
* ``kfold_class_splits``: class-disjoint k-fold cross-validation inside the training classes.
  ``scheme="mlrc"`` reproduces powerful-benchmarker's ``MLRCSplitManager`` (reference-
  implementations.md §3 "Splits"): fold p starts at ``int(p/k * C)`` of the sorted classes; the
  next ``n_train`` classes (wrapping) train and the following ``n_val`` (wrapping) validate, with
  ``n_val = int(C_total * (1 - test_size) / k)`` computed on *all* classes as that code does.
  ``scheme="linspace"`` is ASAP's later code (docs/readings/asap.md#asap-r33): partitions cut at
  ``np.linspace(0, C, k + 1)`` (truncated to int), fold p validates on partition p.
* ``holdout_split``: RSW's 50/50 train/val split of the training classes (docs/readings/rsw.md#rsw-r11).
* ``sample_holdout``: not class-disjoint — the last ``fraction`` of each training class's images
  (in manifest order) validate: ASAP's MNIST proof of concept, "10 % of train as validation"
  (docs/readings/asap.md#asap-r28, a reading; per class so that every class is validated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .manifest import Manifest


def standard_split(labels: Sequence[int], n_train_classes: int | None = None) -> list[str]:
    """``train`` for the first half (or ``n_train_classes``) of the sorted class ids, else ``test``."""
    classes = np.unique(np.asarray(labels))
    n_train = len(classes) // 2 if n_train_classes is None else n_train_classes
    train = set(classes[:n_train].tolist())
    return ["train" if int(label) in train else "test" for label in labels]


def kfold_class_splits(
    train_classes: Sequence[int],
    n_folds: int = 4,
    scheme: Literal["mlrc", "linspace"] = "mlrc",
    test_size: float = 0.5,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Return ``n_folds`` pairs (fold-train classes, fold-val classes), each sorted."""
    classes = np.unique(np.asarray(train_classes))
    c = len(classes)
    if n_folds < 2 or c < n_folds:
        raise ValueError(
            f"kfold_class_splits: need 2 <= n_folds <= number of classes, got n_folds={n_folds}, classes={c}"
        )
    folds = []
    if scheme == "mlrc":
        # MLRCSplitManager sizes the splits on all classes (train+val+test), then drops test.
        total = int(round(c / (1.0 - test_size)))
        n_val = int(total * (1.0 / n_folds) * (1.0 - test_size))
        n_train = c - n_val
        for p in range(n_folds):
            start = int(p / n_folds * c)
            tr = (start + np.arange(n_train)) % c
            va = (start + n_train + np.arange(n_val)) % c
            folds.append((np.sort(classes[tr]), np.sort(classes[va])))
    elif scheme == "linspace":
        edges = np.linspace(0, c, n_folds + 1).astype(int)
        for p in range(n_folds):
            va = np.arange(edges[p], edges[p + 1])
            tr = np.setdiff1d(np.arange(c), va)
            folds.append((classes[tr], classes[va]))
    else:
        raise ValueError(f"kfold_class_splits: scheme {scheme!r}, expected 'mlrc' or 'linspace'")
    return folds


def holdout_split(train_classes: Sequence[int], val_fraction: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """First ``1 - val_fraction`` of the sorted classes train, the rest validate (RSW: 50/50)."""
    classes = np.unique(np.asarray(train_classes))
    n_tr = len(classes) - int(round(len(classes) * val_fraction))
    return classes[:n_tr], classes[n_tr:]


def sample_holdout(labels: Sequence[int], fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(train positions, validation positions) into ``labels``: per class, the last
    ``round(fraction · n_c)`` positions validate (at least one of a class with two or more images),
    the rest train; both sorted."""
    labels = np.asarray(labels)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"sample_holdout: fraction must be in (0, 1), got {fraction}")
    val = []
    for c in np.unique(labels):
        class_rows = np.flatnonzero(labels == c)
        n_val = min(max(int(round(len(class_rows) * fraction)), 1), len(class_rows) - 1)
        val.append(class_rows[len(class_rows) - n_val :])
    val = np.sort(np.concatenate(val)) if val else np.zeros(0, dtype=int)
    return np.setdiff1d(np.arange(len(labels)), val), val


def has_validation_split(validation_cfg: Mapping[str, Any] | None) -> bool:
    """Whether a run's ``validation`` section holds part of the training split out (``validation.split``)."""
    return bool(validation_cfg) and validation_cfg.get("split") is not None


def split_indices(
    manifest: Manifest,
    subset: str,
    fold: int | None = None,
    n_folds: int = 4,
    scheme: Literal["mlrc", "linspace"] = "mlrc",
    fraction: float = 0.1,
) -> np.ndarray:
    """Row indices of a subset of a manifest.

    ``subset``: ``train`` | ``test`` | ``query`` | ``gallery`` (as in the manifest), or with a
    ``fold``: ``fold_train`` | ``fold_val`` (class-disjoint k-fold inside ``train``), or
    ``holdout_train`` | ``holdout_val`` (50/50 class split of ``train``, no fold), or
    ``samples_train`` | ``samples_val`` (the last ``fraction`` of each class's ``train`` images validate).
    """
    if subset in ("train", "test", "query", "gallery"):
        return manifest.indices(subset)
    train_idx = manifest.indices("train")
    labels = manifest.labels[train_idx]
    if subset in ("samples_train", "samples_val"):
        tr, va = sample_holdout(labels, fraction)
        return train_idx[tr if subset == "samples_train" else va]
    if subset in ("holdout_train", "holdout_val"):
        tr, va = holdout_split(np.unique(labels))
        keep = tr if subset == "holdout_train" else va
    elif subset in ("fold_train", "fold_val"):
        if fold is None or not 0 <= fold < n_folds:
            raise ValueError(f"split_indices: subset {subset!r} needs fold in [0, {n_folds}), got {fold}")
        tr, va = kfold_class_splits(np.unique(labels), n_folds, scheme)[fold]
        keep = tr if subset == "fold_train" else va
    else:
        raise ValueError(
            f"split_indices: unknown subset {subset!r}; expected train, test, query, gallery, "
            "fold_train, fold_val, holdout_train, holdout_val, samples_train or samples_val"
        )
    return train_idx[np.isin(labels, keep)]
