"""NMI of k-means clusters against class labels (k-means + sklearn NMI).

k = number of distinct labels, as in pytorch-metric-learning's ``AccuracyCalculator`` and the
RSW code. Two k-means back ends, both seeded (deterministic for a given input, seed and build):

* ``kmeans="faiss"`` — faiss ``Kmeans``, 20 Lloyd iterations from k random points, one run
  (pytorch-metric-learning's ``AccuracyCalculator``);
* ``kmeans="sklearn"`` — scikit-learn ``KMeans(k)`` with the defaults of scikit-learn 1.0.2
  (k-means++, ``n_init=10`` restarts, ``max_iter=300``), which is what the official RSW code calls
  (docs/readings/rsw.md#rsw-r8); ``n_init`` is explicit because later releases changed its default.

``average_method`` is sklearn's: "arithmetic" (sklearn/PML default) or "geometric" (the RSW
code). The run-config key ``eval.nmi`` selects them: ``true`` = :data:`NMI_DEFAULTS`, or a
mapping of :data:`NMI_DEFAULTS`' keys (:func:`nmi_options`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from dmlrepro.config_names import KMEANS, NMI_DEFAULTS, nmi_options  # noqa: F401  (eval.nmi's parser, torch-free)

from .knn import import_faiss, to_float32_matrix, to_label_vector


def kmeans_assignments(
    embeddings: Any, num_clusters: int, *, seed: int = 0, niter: int = 20, nredo: int = 1
) -> np.ndarray:
    """Cluster index (int64, shape (N,)) of each row under seeded faiss k-means (CPU)."""
    faiss = import_faiss()
    x = to_float32_matrix(embeddings)
    if not 1 <= num_clusters <= x.shape[0]:
        raise ValueError(f"k-means needs 1 <= num_clusters <= N, got num_clusters={num_clusters}, N={x.shape[0]}")
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


def sklearn_kmeans_assignments(embeddings: Any, num_clusters: int, *, seed: int = 0, n_init: int = 10) -> np.ndarray:
    """Cluster index (int64, shape (N,)) of each row under scikit-learn ``KMeans`` (k-means++,
    ``n_init`` restarts, 300 iterations: the defaults of scikit-learn 1.0.2), seeded."""
    from sklearn.cluster import KMeans  # noqa: PLC0415  (deferred: scikit-learn (seconds), only the sklearn backend)

    x = to_float32_matrix(embeddings)
    if not 1 <= num_clusters <= x.shape[0]:
        raise ValueError(f"k-means needs 1 <= num_clusters <= N, got num_clusters={num_clusters}, N={x.shape[0]}")
    km = KMeans(
        n_clusters=int(num_clusters),
        init="k-means++",
        n_init=int(n_init),
        max_iter=300,
        tol=1e-4,
        random_state=int(seed),
    )
    return km.fit(x).labels_.astype(np.int64)


def nmi(
    embeddings: Any,
    labels: Any,
    seed: int = 0,
    *,
    niter: int = 20,
    nredo: int = 1,
    average_method: str = "arithmetic",
    kmeans: str = "faiss",
    n_init: int = 10,
) -> float:
    """Normalised mutual information between labels and k-means clusters (k = #labels).

    Defaults follow pytorch-metric-learning (faiss k-means, 20 iterations, one run; ``nredo > 1``
    keeps the faiss run of lowest objective). ``kmeans="sklearn"`` clusters with scikit-learn's
    ``KMeans`` (``n_init`` k-means++ restarts), as the RSW code does.
    """
    from sklearn.metrics import normalized_mutual_info_score  # noqa: PLC0415  (deferred: scikit-learn (seconds))

    if kmeans not in KMEANS:
        raise ValueError(f"kmeans must be one of {list(KMEANS)}, got {kmeans!r}")
    x = to_float32_matrix(embeddings)
    y = to_label_vector(labels, x.shape[0])
    key = (_digest(x), _digest(y), seed, niter, nredo, average_method, kmeans, n_init)
    if key not in _RECENT:
        k = len(np.unique(y))
        if kmeans == "sklearn":
            clusters = sklearn_kmeans_assignments(x, k, seed=seed, n_init=n_init)
        else:
            clusters = kmeans_assignments(x, k, seed=seed, niter=niter, nredo=nredo)
        _RECENT[key] = float(normalized_mutual_info_score(y, clusters, average_method=average_method))
        while len(_RECENT) > _RECENT_SIZE:
            _RECENT.pop(next(iter(_RECENT)))
    return _RECENT[key]


# The last few results: a run clusters its final embeddings twice, at its last evaluation and again
# for metrics.json from the saved file (the same float32 values); k-means is the costly part
# (scikit-learn's 10 restarts; its cost:
# docs/benchmarks.md#the-config-check-without-the-trunk-registry-k-means-once-data-preparation-served-cpu).
_RECENT: dict[tuple, float] = {}
_RECENT_SIZE = 4


def _digest(a: np.ndarray) -> tuple:
    return a.dtype.str, a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def nmi_from_config(embeddings: Any, labels: Any, value: Any, seed: int = 0) -> float:
    """:func:`nmi` with the options of an ``eval.nmi`` value (``true`` or a mapping)."""
    opts = nmi_options(value)
    if opts is None:
        raise ValueError("nmi_from_config: eval.nmi is false")
    return nmi(embeddings, labels, seed, average_method=opts["average"], kmeans=opts["kmeans"], n_init=opts["n_init"])
