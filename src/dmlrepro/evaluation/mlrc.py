"""MLRC ensemble helper (Musgrave et al. 2020; docs/readings/protocols.md#proto-r3).

The "concatenated (512-dim)" result evaluates, for the same items, the L2-normalised 128-d
embeddings of the 4 fold models concatenated and re-normalised (powerful-benchmarker's
``ConcatenateEmbeddings`` with normalised embeddings). The "separated (128-dim)" result is the
mean over folds of each fold's own metrics (no helper needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .embeddings_io import load_embeddings
from .knn import l2_normalize, to_float32_matrix
from .retrieval import compute_retrieval


def concatenate_fold_embeddings(fold_embeddings: Sequence[Any]) -> np.ndarray:
    """L2-normalise each fold's (N, D_f) embeddings, concatenate along features, re-normalise.

    Rows must refer to the same items in the same order in every fold. Returns float32
    (N, Σ D_f) with unit-norm rows.
    """
    if len(fold_embeddings) == 0:
        raise ValueError("fold_embeddings is empty")
    parts = [to_float32_matrix(e, f"fold {i} embeddings") for i, e in enumerate(fold_embeddings)]
    n = parts[0].shape[0]
    for i, p in enumerate(parts):
        if p.shape[0] != n:
            raise ValueError(f"fold {i} has {p.shape[0]} rows but fold 0 has {n}: folds must embed the same items")
    return l2_normalize(np.concatenate([l2_normalize(p) for p in parts], axis=1))


def fold_ensemble_metrics(
    query_files: Sequence[Any], ks: Sequence[int] = (1,), gallery_files: Sequence[Any] | None = None
) -> dict[str, float]:
    """MLRC "Concatenated (512-dim)" metrics of the fold models (fold order): their saved test
    embeddings `query_files` (and `gallery_files` for query→gallery datasets such as In-Shop)
    concatenated by :func:`concatenate_fold_embeddings`, then the retrieval metrics of
    :func:`compute_retrieval` on the result (Euclidean on unit vectors)."""

    def stacked(files: Sequence[Any]):
        sets = [load_embeddings(f) for f in files]
        for f, s in zip(files, sets):
            if not (np.array_equal(s.indices, sets[0].indices) and np.array_equal(s.labels, sets[0].labels)):
                raise ValueError(f"{f} embeds other items than {files[0]}: folds must share the test split")
        return concatenate_fold_embeddings([s.embeddings for s in sets]), sets[0].labels

    if not query_files:
        raise ValueError("fold_ensemble_metrics: no fold runs")
    query, labels = stacked(query_files)
    gallery, gallery_labels = stacked(gallery_files) if gallery_files else (None, None)
    return compute_retrieval(
        query, labels, tuple(ks), gallery=gallery, gallery_labels=gallery_labels, distance="euclidean"
    ).metrics
