"""Saving and loading a run's embeddings (one file per split, reused by every metric).

Format: an uncompressed ``.npz`` (no pickles) with the arrays

* ``embeddings`` float32 (N, D)
* ``labels``     (N,) class labels as given (ints in practice)
* ``indices``    int64 (N,) row of each item in the dataset manifest/split (default 0..N-1)
* ``split``      0-d unicode string, e.g. "test", "val", "train", "query", "gallery"
* ``meta``       0-d unicode string holding a JSON object (free-form provenance)

All writes are atomic: a temporary file in the destination folder, fsync, then ``os.replace``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..atomic import atomic_open, write_json_atomic  # noqa: F401  (write_json_atomic is re-exported)
from .knn import to_float32_matrix, to_label_vector

FORMAT_VERSION = 1
_REQUIRED = ("embeddings", "labels", "indices", "split")


@dataclass(frozen=True)
class EmbeddingSet:
    """Embeddings of one split of one run."""

    embeddings: np.ndarray
    labels: np.ndarray
    indices: np.ndarray
    split: str
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.embeddings.shape[0])


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(fileobj)`` on a temporary file beside ``path``, then rename it onto ``path``."""
    with atomic_open(path, "wb") as f:
        write(f)
    return Path(path)


def save_embeddings(
    path: str | os.PathLike,
    embeddings: Any,
    labels: Any,
    indices: Any = None,
    *,
    split: str = "test",
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Save one split's embeddings atomically to ``path`` (``.npz``); returns the path."""
    emb = to_float32_matrix(embeddings)
    n = emb.shape[0]
    lab = to_label_vector(labels, n, "labels")
    if lab.dtype == object:
        raise ValueError("labels must be numeric or strings, not Python objects")
    if indices is None:
        idx = np.arange(n, dtype=np.int64)
    else:
        idx = to_label_vector(indices, n, "indices").astype(np.int64)
    meta_json = json.dumps({"format_version": FORMAT_VERSION, **dict(meta or {})}, sort_keys=True)
    arrays = {
        "embeddings": emb,
        "labels": lab,
        "indices": idx,
        "split": np.array(str(split)),
        "meta": np.array(meta_json),
    }
    return atomic_write(path, lambda f: np.savez(f, **arrays))


def load_embeddings(path: str | os.PathLike) -> EmbeddingSet:
    """Load a file written by :func:`save_embeddings`, checking keys and shapes."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"embeddings file not found: {path}")
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in _REQUIRED if k not in z.files]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}; expected {list(_REQUIRED)}")
        emb = z["embeddings"]
        labels = z["labels"]
        indices = z["indices"]
        split = str(z["split"])
        meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
    if emb.ndim != 2:
        raise ValueError(f"{path}: 'embeddings' must be 2-D, got shape {emb.shape}")
    for key, arr in (("labels", labels), ("indices", indices)):
        if arr.shape != (emb.shape[0],):
            raise ValueError(f"{path}: '{key}' has shape {arr.shape}, expected ({emb.shape[0]},) like 'embeddings'")
    return EmbeddingSet(emb.astype(np.float32, copy=False), labels, indices, split, meta)
