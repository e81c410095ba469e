"""Evaluate a saved embeddings file and write ``metrics.json`` (the pipeline's evaluate step)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .clustering import nmi as nmi_score
from ..atomic import write_json_atomic
from .embeddings_io import load_embeddings
from .retrieval import DEFAULT_KS, compute_retrieval

log = logging.getLogger(__name__)


def evaluate_embeddings_file(
    embeddings_path: str | os.PathLike,
    metrics_path: str | os.PathLike | None = None,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    distance: str = "euclidean",
    retrieval: bool = True,
    nmi: bool = False,
    nmi_seed: int = 0,
    nmi_average_method: str = "arithmetic",
    gallery_path: str | os.PathLike | None = None,
    extra_metrics: Mapping[str, float] | None = None,
    device: Any = None,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """Compute the requested metrics from one saved embeddings file (loaded once).

    * ``retrieval``: leave-one-out metrics of :func:`retrieval_metrics` on the file, or, with
      ``gallery_path``, query→gallery metrics (the file holds the queries).
    * ``nmi``: k-means NMI on the embeddings of ``embeddings_path``.
    * ``extra_metrics``: values computed elsewhere (e.g. W2, AvgDTP) merged into ``metrics``.

    Returns and (if ``metrics_path``) atomically writes::

        {"metrics": {name: float}, "split": str, "num_items": int, "num_queries": int,
         "num_excluded_queries": int, "distance": str, "ks": [int], "embeddings_file": str,
         "gallery_file": str | None, "nmi_seed": int | None}
    """
    query = load_embeddings(embeddings_path)
    gallery = load_embeddings(gallery_path) if gallery_path is not None else None
    metrics: dict[str, float] = {}
    out: dict[str, Any] = {
        "split": query.split,
        "num_items": len(query),
        "num_queries": None,
        "num_excluded_queries": None,
        "distance": distance,
        "ks": [int(k) for k in ks],
        "embeddings_file": Path(embeddings_path).name,
        "gallery_file": Path(gallery_path).name if gallery_path is not None else None,
        "nmi_seed": int(nmi_seed) if nmi else None,
    }
    if retrieval:
        res = compute_retrieval(
            query.embeddings,
            query.labels,
            ks,
            gallery=None if gallery is None else gallery.embeddings,
            gallery_labels=None if gallery is None else gallery.labels,
            distance=distance,
            device=device,
            chunk_size=chunk_size,
        )
        metrics.update(res.metrics)
        out["num_queries"] = res.num_queries
        out["num_excluded_queries"] = res.num_excluded
        if res.num_excluded:
            log.info(
                "%s: %d of %d queries have no other item of their class and are excluded",
                embeddings_path,
                res.num_excluded,
                len(query),
            )
    if nmi:
        metrics["nmi"] = nmi_score(
            query.embeddings, query.labels, seed=nmi_seed, average_method=nmi_average_method
        )
    for key, value in dict(extra_metrics or {}).items():
        if key in metrics:
            raise ValueError(f"extra metric {key!r} collides with a computed metric")
        metrics[key] = float(value)
    out["metrics"] = metrics
    if metrics_path is not None:
        write_json_atomic(metrics_path, out)
    return out
