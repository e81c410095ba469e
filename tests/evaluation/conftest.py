"""Shared fixtures for tests/evaluation: data generators and float64 brute-force references.

The references are written from the metric definitions (MLRC / Musgrave et al. 2020) with
literal loops over a full float64 distance matrix; they share no code with dmlrepro.
"""

from __future__ import annotations

import numpy as np
import pytest


def make_clustered(
    n: int,
    dim: int,
    seed: int,
    *,
    singletons: int = 3,
    spread: float = 1.0,
    max_class: int = 20,
    quantize: bool = True,
):
    """Random clustered embeddings with imbalanced classes (Zipf-like sizes, some singletons).

    Labels are non-contiguous integers (class c -> 7c + 3) so no code can assume 0..C-1.
    ``quantize``: coordinates are multiples of 2**-6 in [-4, 4) and dim <= 32, so every squared
    distance (also faiss's float32 ||x||² + ||y||² − 2x·y) is computed *exactly* in float32:
    float32 search and the float64 reference then rank identically up to exact ties, which the
    tests rule out with :func:`min_relevance_gap`.
    """
    rng = np.random.default_rng(seed)
    sizes = []
    remaining = n - singletons
    while remaining > 0:
        s = int(min(remaining, max(2, rng.zipf(1.6) + 1)))
        s = min(s, max_class)
        if remaining - s == 1:
            s += 1
        sizes.append(s)
        remaining -= s
    sizes += [1] * singletons
    labels = np.concatenate([np.full(s, 7 * c + 3) for c, s in enumerate(sizes)])
    centers = rng.normal(size=(len(sizes), dim)) * spread
    codes = np.concatenate([np.full(s, c) for c, s in enumerate(sizes)])
    x = centers[codes] + rng.normal(size=(n, dim)) * 0.6
    if quantize:
        assert dim <= 32
        x = np.clip(np.round(x * 64.0), -255, 255) / 64.0
    perm = rng.permutation(n)
    return x[perm].astype(np.float32), labels[perm]


def sq_dist_matrix(x: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
    """Full float64 squared-Euclidean distance matrix, one row at a time (literal)."""
    x = np.asarray(x, dtype=np.float64)
    g = x if g is None else np.asarray(g, dtype=np.float64)
    out = np.empty((x.shape[0], g.shape[0]))
    for i in range(x.shape[0]):
        diff = g - x[i]
        out[i] = (diff * diff).sum(axis=1)
    return out


def cosine_dist_matrix(x: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    g = x if g is None else np.asarray(g, dtype=np.float64)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    return 1.0 - xn @ gn.T


def reference_metrics(dist, qlabels, glabels, ks, *, self_search, tie="stable"):
    """Literal metric definitions over a full distance matrix.

    ``self_search``: query i is gallery item i and is removed from its own ranking by index.
    ``tie``: "stable" (index order), "optimistic" (relevant items first among equal distances)
    or "pessimistic" (relevant items last) — the last two bound every valid tie order.
    Queries without any other item of their class are skipped (as the MLRC/PML definition).
    """
    nq = dist.shape[0]
    sums = {f"recall@{k}": 0.0 for k in ks}
    sums.update({"precision@1": 0.0, "r_precision": 0.0, "map@r": 0.0})
    count = 0
    for q in range(nq):
        cand = np.arange(dist.shape[1])
        if self_search:
            cand = cand[cand != q]
        rel_all = glabels[cand] == qlabels[q]
        R = int(rel_all.sum())
        if R == 0:
            continue
        d = dist[q, cand]
        if tie == "stable":
            order = np.argsort(d, kind="stable")
        elif tie == "optimistic":
            order = np.lexsort((~rel_all, d))
        else:
            order = np.lexsort((rel_all, d))
        rel = rel_all[order]
        count += 1
        for k in ks:
            sums[f"recall@{k}"] += float(any(rel[i] for i in range(min(k, len(rel)))))
        sums["precision@1"] += float(rel[0])
        sums["r_precision"] += sum(float(rel[i]) for i in range(R)) / R
        ap = 0.0
        for i in range(R):
            if rel[i]:
                hits = sum(1 for j in range(i + 1) if rel[j])
                ap += hits / (i + 1)
        sums["map@r"] += ap / R
    return {key: v / count for key, v in sums.items()}


def min_relevance_gap(dist, qlabels, glabels, window, *, self_search) -> float:
    """Smallest |d(a) - d(b)| over pairs (a relevant, b irrelevant) within each query's first
    ``window`` ranks (self excluded), relative to the query's distance scale. A comparison of
    float32 search against the float64 reference is well defined when this is >> 1e-6."""
    worst = np.inf
    for q in range(dist.shape[0]):
        cand = np.arange(dist.shape[1])
        if self_search:
            cand = cand[cand != q]
        d = dist[q, cand]
        order = np.argsort(d, kind="stable")[: window + 1]
        dd = d[order]
        rel = glabels[cand][order] == qlabels[q]
        if rel.all() or not rel.any():
            continue
        a, b = np.sort(dd[rel]), np.sort(dd[~rel])
        pos = np.clip(np.searchsorted(b, a), 1, len(b) - 1) if len(b) > 1 else np.zeros(len(a), int)
        gap = np.minimum(np.abs(a - b[pos]), np.abs(a - b[np.maximum(pos - 1, 0)]))
        scale = max(dd.max(), 1e-12)
        worst = min(worst, float(gap.min() / scale))
    return worst


@pytest.fixture
def clustered():
    return make_clustered


@pytest.fixture
def reference():
    return reference_metrics


@pytest.fixture
def sqdist():
    return sq_dist_matrix


@pytest.fixture
def cosdist():
    return cosine_dist_matrix


@pytest.fixture
def relevance_gap():
    return min_relevance_gap
