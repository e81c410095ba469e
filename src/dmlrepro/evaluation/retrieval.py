"""Retrieval metrics: Recall@K, Precision@1, R-Precision and MAP@R, on exact k-NN (:mod:`.knn`).

Definitions (Musgrave et al. 2020, "A Metric Learning Reality Check"; pytorch-metric-learning
``AccuracyCalculator``). For a query q with label y_q, let R_q be the number of *other*
reference items labelled y_q and rel(i) = 1 if the i-th nearest neighbour has label y_q:

* Recall@K     = 1 if rel(i) = 1 for some i <= K (averaged over queries; "R@K" of the papers);
* Precision@1  = rel(1) (equals Recall@1);
* R-Precision  = (1/R_q) Σ_{i<=R_q} rel(i);
* MAP@R        = (1/R_q) Σ_{i<=R_q} P(i)·rel(i), with P(i) = (1/i) Σ_{j<=i} rel(j).

All are micro-averages over the queries with R_q >= 1. Queries whose class has no other item
are excluded from *every* metric (as pytorch-metric-learning does); their number is reported by
:func:`compute_retrieval`. Neighbours are ranked by :mod:`.knn`'s rule (distance, then index),
to depth k_max = max(max(ks), max_q R_q) on faiss, so R-Precision and MAP@R are exact; the torch
path searches max_q R_q and ranks a later first hit exactly on the cost matrix. Every backend,
device and chunk size gives the same numbers (docs/evaluation.md#backends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .knn import prepare_search, resolve_backend, to_label_vector, topk_chunks

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
    """Per-query metric values, for the queries with R_q >= 1, summed once at the end (float64,
    query order): the metrics do not depend on the chunking, the backend or the device."""

    def __init__(self, ks: tuple[int, ...]):
        self.ks = ks
        self.first: list[np.ndarray] = []
        self.rp: list[np.ndarray] = []
        self.ap: list[np.ndarray] = []

    def add(self, first: np.ndarray, rel_r: np.ndarray, r: np.ndarray) -> None:
        """``first``: (n,) 0-based rank of each query's first relevant neighbour (any value
        >= max(ks) if none is that near); ``rel_r``: (n, kr) relevance of the first kr = max R_q
        neighbours (the same kr for every chunk); ``r``: (n,) R_q >= 1."""
        kr = rel_r.shape[1]
        rel_r = rel_r & (np.arange(1, kr + 1)[None, :] <= r[:, None])
        cum = np.cumsum(rel_r, axis=1)
        prec_at_i = cum / np.arange(1, kr + 1)[None, :]
        self.first.append(first)
        self.rp.append(rel_r.sum(axis=1) / r)
        self.ap.append((prec_at_i * rel_r).sum(axis=1) / r)

    def result(self) -> dict[str, float]:
        first = np.concatenate(self.first)
        n = len(first)
        out = {f"recall@{k}": float((first < k).sum() / n) for k in self.ks}
        out["precision@1"] = float((first == 0).sum() / n)
        out["r_precision"] = float(np.concatenate(self.rp).sum() / n)
        out["map@r"] = float(np.concatenate(self.ap).sum() / n)
        return out


def _first_hits(rel) -> Any:
    """0-based rank of each row's first True (the row length if none); argmax returns the first
    maximal index."""
    return torch.where(rel.any(dim=1), rel.int().argmax(dim=1), rel.shape[1])


class _Members:
    """The reference rows of every label code, ascending, padded: ``index`` (codes × max count)
    and ``valid`` (False on padding)."""

    def __init__(self, ref_codes: np.ndarray, n_codes: int, device):
        order = np.argsort(ref_codes, kind="stable")
        counts = np.bincount(ref_codes, minlength=n_codes)
        width = max(1, int(counts.max()))
        slot = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
        index = np.zeros((n_codes, width), dtype=np.int64)
        valid = np.zeros((n_codes, width), dtype=bool)
        index[ref_codes[order], slot] = order
        valid[ref_codes[order], slot] = True
        self.index = torch.from_numpy(index).to(device)
        self.valid = torch.from_numpy(valid).to(device)


def _exact_first_hits(full, q_codes, members: _Members) -> Any:
    """The rank of each row's first relevant item under the rule (cost, then index), counted on
    the full cost rows (self at +inf): the items ordered before the best relevant one (b, j_b) —
    those of cost < b, and of cost = b with an index < j_b (irrelevant ones only: b is the
    relevant minimum and j_b its first index)."""
    idx, ok = members.index[q_codes], members.valid[q_codes]
    cost_m = torch.gather(full, 1, idx).masked_fill_(~ok, float("inf"))
    best, best_column = cost_m.min(dim=1)  # the first minimal column: the smallest index (rows ascending)
    below = (full < best[:, None]).sum(dim=1)
    ties = (full <= best[:, None]).sum(dim=1) - below - ((cost_m == best[:, None]) & ok).sum(dim=1)
    rows = torch.nonzero(ties > 0).flatten()  # irrelevant items tied with the best relevant one
    if rows.numel():
        jb = torch.gather(idx[rows], 1, best_column[rows, None])
        cols = torch.arange(full.shape[1], device=full.device)[None, :]
        below[rows] += ((full[rows] == best[rows, None]) & (cols < jb)).sum(dim=1)
    return below


def _rank_stream(search, k_max: int, kr: int, backend: str, q_codes, ref_codes, valid_all, chunk_size, need_rank: int):
    """Yield ``(start, stop, first-hit ranks, rel of the first kr)`` per chunk, numpy, for the
    chunk's valid queries (R_q >= 1). Ranks >= ``need_rank`` (= max K) need not be exact.

    faiss: the k_max first neighbours (a first hit beyond them has rank >= k_max). torch: the kr
    first neighbours, and for the rows without a hit among them, if max K > kr, the exact rank
    counted on the chunk's cost matrix — two passes instead of a top-k of depth k_max (SOP:
    Recall@1000)."""
    dev = search.dev
    codes = {}
    depth = kr if backend == "torch" else k_max
    members = None
    for start, stop, _, idx, full in topk_chunks(search, depth, backend, chunk_size):
        if idx.device not in codes:
            codes[idx.device] = (torch.from_numpy(ref_codes).to(idx.device), torch.from_numpy(q_codes).to(idx.device))
        ref_t, q_t = codes[idx.device]
        valid = torch.from_numpy(valid_all[start:stop]).to(idx.device)
        rel = ref_t[idx[valid]] == q_t[start:stop][valid][:, None]
        first = _first_hits(rel)
        if full is not None and depth < min(need_rank, search.n_candidates):
            miss = torch.nonzero(first == rel.shape[1]).flatten()
            if miss.numel():
                if members is None:
                    members = _Members(ref_codes, int(max(ref_codes.max(), q_codes.max())) + 1, dev)
                rows = torch.nonzero(valid.to(dev)).flatten()[miss.to(dev)]
                first = first.clone()
                first[miss] = _exact_first_hits(full[rows], q_t[start:stop].to(dev)[rows], members).to(first.device)
        yield start, stop, first.cpu().numpy(), rel[:, :kr].cpu().numpy()


def compute_retrieval(
    embeddings: Any,
    labels: Any,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    gallery: Any = None,
    gallery_labels: Any = None,
    distance: str = "euclidean",
    device: Any = None,
    backend: str = "auto",
    chunk_size: int | None = None,
) -> RetrievalResult:
    """Shared engine of :func:`retrieval_metrics` (``gallery=None``: leave-one-out within
    ``embeddings``) and :func:`retrieval_metrics_query_gallery`."""
    ks = _check_ks(ks)
    n = len(embeddings)
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
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
    search = prepare_search(embeddings, gallery, distance, device)
    k_max = min(max(max(ks), int(r_all.max())), search.n_candidates)
    kr = min(int(r_all.max()), search.n_candidates)
    chosen = resolve_backend(backend, search.dev, min(k_max + 1, search.n_candidates) + int(search.self_search))
    acc = _Accumulator(ks)
    for start, stop, first, rel_r in _rank_stream(
        search, k_max, kr, chosen, q_codes, ref_codes, valid_all, chunk_size, max(ks)
    ):
        acc.add(first, rel_r, r_all[start:stop][valid_all[start:stop]])
    return RetrievalResult(
        metrics=acc.result(),
        num_queries=num_valid,
        num_excluded=n - num_valid,
        k_searched=int(k_max),
        info={"distance": distance, "ks": list(ks), "backend": chosen, "device": str(search.dev)},
    )


def retrieval_metrics(
    embeddings: Any,
    labels: Any,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    distance: str = "euclidean",
    device: Any = None,
    backend: str = "auto",
    chunk_size: int | None = None,
) -> dict[str, float]:
    """Leave-one-out retrieval metrics: every item queries all *other* items.

    Returns ``{"recall@k" for k in ks, "precision@1", "r_precision", "map@r"}``, floats in
    [0, 1]. ``distance="euclidean"`` ranks by L2 distance on the vectors as given (unnormalised
    for RSW; on L2-normalised vectors it ranks like cosine); ``"cosine"`` normalises first.
    Inputs: torch tensors (any device) or numpy arrays; the search runs in float32 on ``device``
    (default: the embeddings' device; numpy: the CPU) with ``backend`` "auto", "torch",
    "faiss-cpu" or "faiss-gpu" (:mod:`dmlrepro.evaluation.knn`); every backend ranks by the same
    rule (distance, then index), so they return identical metrics.
    Never builds an N×N matrix (query chunks of ``chunk_size`` rows, default adaptive).
    K larger than N-1 is clamped to N-1 (every other item is retrieved).
    Lone-class queries are excluded (module docstring). Ties: see docs/evaluation.md.
    """
    return compute_retrieval(
        embeddings, labels, ks, distance=distance, device=device, backend=backend, chunk_size=chunk_size
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
    backend: str = "auto",
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
        backend=backend,
        chunk_size=chunk_size,
    ).metrics
