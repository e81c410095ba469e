"""NMI of k-means clusters against class labels (faiss k-means + sklearn NMI).

k = number of distinct labels, as in pytorch-metric-learning's ``AccuracyCalculator`` and the
RSW code. faiss ``Kmeans`` is seeded, so the result is deterministic for a given input, seed and
faiss build. ``average_method`` is sklearn's: "arithmetic" (sklearn/PML default) or "geometric"
(the RSW code, rsw.md §3.5).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .knn import import_faiss, to_float32_matrix, to_label_vector


def kmeans_assignments(
    embeddings: Any, num_clusters: int, *, seed: int = 0, niter: int = 20, nredo: int = 1
) -> np.ndarray:
    """Cluster index (int64, shape (N,)) of each row under seeded faiss k-means (CPU)."""
    faiss = import_faiss()
    x = to_float32_matrix(embeddings)
    if not 1 <= num_clusters <= x.shape[0]:
        raise ValueError(
            f"k-means needs 1 <= num_clusters <= N, got num_clusters={num_clusters}, N={x.shape[0]}"
        )
    km = faiss.Kmeans(
        x.shape[1],
        int(num_clusters),
        niter=int(niter),
        nredo=int(nredo),
        seed=int(seed),
        verbose=False,
    )
    km.train(x)
    _, assign = km.index.search(x, 1)
    return assign[:, 0].astype(np.int64)


def nmi(
    embeddings: Any,
    labels: Any,
    seed: int = 0,
    *,
    niter: int = 20,
    nredo: int = 1,
    average_method: str = "arithmetic",
) -> float:
    """Normalised mutual information between labels and k-means clusters (k = #labels).

    Defaults follow pytorch-metric-learning (faiss k-means, 20 iterations, one run). faiss
    initialises with k random points; ``nredo > 1`` keeps the run of lowest k-means objective,
    closer to the k-means++/multi-restart sklearn ``KMeans`` of the RSW code.
    """
    from sklearn.metrics import normalized_mutual_info_score  # noqa: PLC0415

    x = to_float32_matrix(embeddings)
    y = to_label_vector(labels, x.shape[0])
    k = len(np.unique(y))
    clusters = kmeans_assignments(x, k, seed=seed, niter=niter, nredo=nredo)
    return float(normalized_mutual_info_score(y, clusters, average_method=average_method))
