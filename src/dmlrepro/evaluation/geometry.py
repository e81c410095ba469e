"""Embedding-space geometry of ASAP Fig. 7 (paper A.3.1; docs/readings/asap.md#asap-r23).

* :func:`average_covering_radius` — "covering radii for 1 to n sample case in k-Center … then the
  average": per class with n samples, r_k = max_x min_{s ∈ S_k} ‖x − s‖ for the greedy
  farthest-first k-centre set S_k (exact k-centre is NP-hard; a reading, ASAP-R23), k = 1..n,
  averaged over k, then over classes. S_1 is the class's first sample (the greedy's seed).
* :func:`mean_interclass_distance` — the mean ‖f(x) − f(x')‖ over pairs with y ≠ y'.

Both in the space they are given (ASAP-R23: the 128-d normalised embedding; t-SNE only displays).
"""

from __future__ import annotations

import numpy as np
import torch

from dmlrepro.asap.kcenter import farthest_first


def greedy_covering_radii(points: np.ndarray) -> np.ndarray:
    """r_1..r_n of the farthest-first traversal of `points` (n, D) started at point 0 (the traversal
    is ASAP's own k-Center, :func:`dmlrepro.asap.kcenter.farthest_first`)."""
    points = np.asarray(points, dtype=np.float64)
    if len(points) == 0:
        raise ValueError("greedy_covering_radii: no points")
    order = farthest_first(torch.from_numpy(points), len(points)).numpy()
    dist = np.linalg.norm(points[:, None, :] - points[None, order, :], axis=-1)  # point -> k-th centre
    return np.minimum.accumulate(dist, axis=1).max(axis=0)


def average_covering_radius(embeddings: np.ndarray, labels: np.ndarray) -> float:
    """Mean over classes of the mean over k of the greedy k-centre covering radius."""
    embeddings, labels = np.asarray(embeddings), np.asarray(labels)
    return float(np.mean([greedy_covering_radii(embeddings[labels == c]).mean() for c in np.unique(labels)]))


def mean_interclass_distance(embeddings: np.ndarray, labels: np.ndarray, chunk: int = 1024) -> float:
    """Mean Euclidean distance over all pairs of items with different labels."""
    x, labels = np.asarray(embeddings, dtype=np.float64), np.asarray(labels)
    total, count = 0.0, 0
    for start in range(0, len(x), chunk):
        block = x[start : start + chunk]
        d = np.sqrt(np.maximum(((block[:, None, :] - x[None, :, :]) ** 2).sum(-1), 0.0))
        other = labels[start : start + chunk, None] != labels[None, :]
        total += float(d[other].sum())
        count += int(other.sum())
    if count == 0:
        raise ValueError("mean_interclass_distance: a single class has no inter-class pairs")
    return total / count
