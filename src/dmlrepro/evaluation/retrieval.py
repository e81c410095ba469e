"""Retrieval metrics: Recall@K, Precision@1, R-Precision and MAP@R, on exact faiss k-NN.

Definitions (Musgrave et al. 2020, "A Metric Learning Reality Check"; pytorch-metric-learning
``AccuracyCalculator``). For a query q with label y_q, let R_q be the number of *other*
reference items labelled y_q and rel(i) = 1 if the i-th nearest neighbour has label y_q:

* Recall@K     = 1 if rel(i) = 1 for some i <= K (averaged over queries; "R@K" of the papers);
* Precision@1  = rel(1) (equals Recall@1);
* R-Precision  = (1/R_q) Σ_{i<=R_q} rel(i);
* MAP@R        = (1/R_q) Σ_{i<=R_q} P(i)·rel(i), with P(i) = (1/i) Σ_{j<=i} rel(j).

All are micro-averages over the queries with R_q >= 1. Queries whose class has no other item
are excluded from *every* metric (as pytorch-metric-learning does); their number is reported by
:func:`compute_retrieval`. The neighbour list is searched to depth
k_max = max(max(ks), max_q R_q), so R-Precision and MAP@R are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .knn import iter_knn, to_label_vector

DEFAULT_KS = (1, 2, 4, 8)
INSHOP_KS = (1, 10, 20, 30, 40, 50)


@dataclass
class RetrievalResult:
    """Metrics plus bookkeeping: ``num_queries`` evaluated and ``num_excluded`` lone queries."""

    metrics: dict[str, float]
    num_queries: int
    num_excluded: int
    k_searched: int
    info: dict[str, Any] = field(default_factory=dict)


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks:
        raise ValueError("ks must contain at least one K")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"every K in ks must be a positive integer, got {k!r}")
    return tuple(int(k) for k in ks)


class _Accumulator:
    """Sums per-query metric values over chunks (float64), for the queries with R_q >= 1."""

    def __init__(self, ks: tuple[int, ...]):
        self.ks = ks
        self.recall = np.zeros(len(ks))
        self.p1 = 0.0
        self.rp = 0.0
        self.map_r = 0.0
        self.n = 0

    def add(self, rel: np.ndarray, r: np.ndarray) -> None:
        """``rel``: (n, k) bool relevance of the ranked neighbours; ``r``: (n,) R_q >= 1."""
        if rel.shape[0] == 0:
            return
        kk = rel.shape[1]
        for j, k in enumerate(self.ks):
            self.recall[j] += rel[:, : min(k, kk)].any(axis=1).sum()
        self.p1 += rel[:, 0].sum()
        # R-Precision and MAP@R only look at the first R_q <= max R columns.
        kr = min(kk, int(r.max()))
        within_r = np.arange(1, kr + 1)[None, :] <= r[:, None]
        rel_r = rel[:, :kr] & within_r
        hits = rel_r.sum(axis=1)
        self.rp += (hits / r).sum()
        cum = np.cumsum(rel_r, axis=1)
        prec_at_i = cum / np.arange(1, kr + 1)[None, :]
        self.map_r += ((prec_at_i * rel_r).sum(axis=1) / r).sum()
        self.n += rel.shape[0]

    def result(self) -> dict[str, float]:
        n = self.n
        out = {f"recall@{k}": float(self.recall[j] / n) for j, k in enumerate(self.ks)}
        out["precision@1"] = float(self.p1 / n)
        out["r_precision"] = float(self.rp / n)
        out["map@r"] = float(self.map_r / n)
        return out


def compute_retrieval(
    embeddings: Any,
    labels: Any,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    gallery: Any = None,
    gallery_labels: Any = None,
    distance: str = "euclidean",
    device: Any = None,
    chunk_size: int | None = None,
) -> RetrievalResult:
    """Shared engine of :func:`retrieval_metrics` (``gallery=None``: leave-one-out within
    ``embeddings``) and :func:`retrieval_metrics_query_gallery`."""
    ks = _check_ks(ks)
    n = len(embeddings)
    y = to_label_vector(labels, n, "labels" if gallery is None else "query labels")
    if gallery is None:
        _, codes = np.unique(y, return_inverse=True)
        codes = codes.reshape(-1)
        counts = np.bincount(codes)
        r_all = counts[codes] - 1  # other items of the query's class
        ref_codes = codes
        q_codes = codes
    else:
        if gallery_labels is None:
            raise ValueError("gallery_labels is required with gallery")
        ng = len(gallery)
        yg = to_label_vector(gallery_labels, ng, "gallery labels")
        _, all_codes = np.unique(np.concatenate([y, yg]), return_inverse=True)
        all_codes = all_codes.reshape(-1)
        q_codes, ref_codes = all_codes[:n], all_codes[n:]
        counts = np.bincount(ref_codes, minlength=int(all_codes.max()) + 1)
        r_all = counts[q_codes]
    valid_all = r_all >= 1
    num_valid = int(valid_all.sum())
    if num_valid == 0:
        raise ValueError(
            "no query has another item of its class in the reference set: retrieval metrics are "
            f"undefined ({n} queries, {len(np.unique(y))} labels)"
        )
    k_max = max(max(ks), int(r_all.max()))
    acc = _Accumulator(ks)
    k_searched = None
    for start, stop, _, idx in iter_knn(
        embeddings,
        k_max,
        gallery,
        distance=distance,
        device=device,
        chunk_size=chunk_size,
    ):
        k_searched = idx.shape[1]
        valid = valid_all[start:stop]
        rel = ref_codes[idx[valid]] == q_codes[start:stop][valid][:, None]
        acc.add(rel, r_all[start:stop][valid])
    return RetrievalResult(
        metrics=acc.result(),
        num_queries=num_valid,
        num_excluded=n - num_valid,
        k_searched=int(k_searched),
        info={"distance": distance, "ks": list(ks)},
    )


def retrieval_metrics(
    embeddings: Any,
    labels: Any,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    distance: str = "euclidean",
    device: Any = None,
    chunk_size: int | None = None,
) -> dict[str, float]:
    """Leave-one-out retrieval metrics: every item queries all *other* items.

    Returns ``{"recall@k" for k in ks, "precision@1", "r_precision", "map@r"}``, floats in
    [0, 1]. ``distance="euclidean"`` ranks by L2 distance on the vectors as given (unnormalised
    for RSW; on L2-normalised vectors it ranks like cosine); ``"cosine"`` normalises first.
    Inputs: torch tensors (any device) or numpy arrays; computation in float32 on faiss exact
    search (GPU when faiss has GPUs and the embeddings are CUDA tensors, see ``device``).
    Never builds an N×N matrix (query chunks of ``chunk_size`` rows, default adaptive).
    K larger than N-1 is clamped to N-1 (every other item is retrieved).
    Lone-class queries are excluded (module docstring). Ties: see docs/evaluation.md.
    """
    return compute_retrieval(
        embeddings, labels, ks, distance=distance, device=device, chunk_size=chunk_size
    ).metrics


def retrieval_metrics_query_gallery(
    query: Any,
    query_labels: Any,
    gallery: Any,
    gallery_labels: Any,
    ks: Sequence[int] = INSHOP_KS,
    *,
    distance: str = "euclidean",
    device: Any = None,
    chunk_size: int | None = None,
) -> dict[str, float]:
    """Query→gallery retrieval (In-Shop): each query ranks the whole gallery, no self-exclusion.

    Same keys and definitions as :func:`retrieval_metrics` with R_q = number of gallery items
    with the query's label; queries whose label is absent from the gallery are excluded.
    """
    return compute_retrieval(
        query,
        query_labels,
        ks,
        gallery=gallery,
        gallery_labels=gallery_labels,
        distance=distance,
        device=device,
        chunk_size=chunk_size,
    ).metrics
