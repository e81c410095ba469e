"""Evaluate a saved embeddings file and write ``metrics.json`` (the pipeline's evaluate step)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..asap.normalisation import normalize_array
from ..atomic import write_json_atomic
from .clustering import nmi as nmi_score, nmi_options
from .embeddings_io import EmbeddingSet, load_embeddings
from .knn import SEARCH_PRECISION
from .retrieval import DEFAULT_KS, compute_retrieval

log = logging.getLogger(__name__)


def evaluate_embeddings_file(
    embeddings_path: str | os.PathLike,
    metrics_path: str | os.PathLike | None = None,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    distance: str = "euclidean",
    retrieval: bool = True,
    nmi: bool | Mapping[str, Any] = False,
    nmi_seed: int = 0,
    nmi_average_method: str = "arithmetic",
    gallery_path: str | os.PathLike | None = None,
    extra_metrics: Mapping[str, float] | None = None,
    device: Any = None,
    chunk_size: int | None = None,
    normalize: str = "none",
    backend: str = "auto",
) -> dict[str, Any]:
    """Compute the requested metrics from one saved embeddings file (loaded once).

    * ``retrieval``: leave-one-out metrics of :func:`retrieval_metrics` on the file, or, with
      ``gallery_path``, query→gallery metrics (the file holds the queries).
    * ``nmi``: k-means NMI on the embeddings of ``embeddings_path``; ``true`` (with
      ``nmi_average_method``) or an ``eval.nmi`` mapping (``dmlrepro.evaluation.clustering.nmi_options``).
    * ``normalize``: "lipschitz" applies ASAP's v / max(1, ‖v‖) (or "l2" v / ‖v‖) to the loaded
      embeddings before every metric (run-config ``eval.normalize``).
    * ``device``, ``backend``: where and how the k-NN search runs (:mod:`dmlrepro.evaluation.knn`;
      the metrics are the same on every device and backend).
    * ``extra_metrics``: values computed elsewhere (e.g. W2, AvgDTP) merged into ``metrics``.

    Returns and (if ``metrics_path``) atomically writes::

        {"metrics": {name: float}, "split": str, "num_items": int, "num_queries": int,
         "num_excluded_queries": int, "distance": str, "ks": [int], "embeddings_file": str,
         "gallery_file": str | None, "nmi_seed": int | None, "precision": {"search": "float32"}}

    The k-NN search runs in exact float32 (:func:`~dmlrepro.evaluation.knn.exact_float32`) on every device.
    """
    query = load_embeddings(embeddings_path)
    gallery = load_embeddings(gallery_path) if gallery_path is not None else None
    q_emb, g_emb = _normalised(query, gallery, normalize)
    out = _record(
        query, embeddings_path, gallery_path, distance=distance, ks=ks, nmi_seed=int(nmi_seed) if nmi else None
    )
    metrics: dict[str, float] = {}
    if retrieval:
        res = _retrieval(
            q_emb,
            query,
            g_emb,
            gallery,
            embeddings_path,
            ks=ks,
            distance=distance,
            device=device,
            backend=backend,
            chunk_size=chunk_size,
        )
        metrics.update(res.metrics)
        out.update(num_queries=res.num_queries, num_excluded_queries=res.num_excluded)
    if nmi:
        metrics["nmi"] = _nmi(q_emb, query.labels, nmi, seed=nmi_seed, average_method=nmi_average_method)
    _add_extra_metrics(metrics, extra_metrics)
    out["metrics"] = metrics
    if metrics_path is not None:
        write_json_atomic(metrics_path, out)
    return out


def _normalised(query: EmbeddingSet, gallery: EmbeddingSet | None, mode: str):
    """The query and gallery embeddings after run-config ``eval.normalize`` (docs/readings/asap.md#asap-r32)."""
    q_emb, g_emb = query.embeddings, None if gallery is None else gallery.embeddings
    if mode == "none":
        return q_emb, g_emb
    return normalize_array(q_emb, mode), None if g_emb is None else normalize_array(g_emb, mode)


def _record(
    query: EmbeddingSet, embeddings_path, gallery_path, *, distance: str, ks: Sequence[int], nmi_seed: int | None
) -> dict[str, Any]:
    """metrics.json's fields but the metrics; the query counts stay None without retrieval."""
    return {
        "split": query.split,
        "num_items": len(query),
        "num_queries": None,
        "num_excluded_queries": None,
        "distance": distance,
        "ks": [int(k) for k in ks],
        "embeddings_file": Path(embeddings_path).name,
        "gallery_file": Path(gallery_path).name if gallery_path is not None else None,
        "nmi_seed": nmi_seed,
        "precision": {"search": SEARCH_PRECISION},  # a run's record replaces it with its own, search included
    }


def _retrieval(
    q_emb,
    query: EmbeddingSet,
    g_emb,
    gallery: EmbeddingSet | None,
    embeddings_path,
    *,
    ks: Sequence[int],
    distance: str,
    device: Any,
    backend: str,
    chunk_size: int | None,
):
    """Leave-one-out (no gallery) or query→gallery retrieval; logs the queries without a positive."""
    res = compute_retrieval(
        q_emb,
        query.labels,
        ks,
        gallery=g_emb,
        gallery_labels=None if gallery is None else gallery.labels,
        distance=distance,
        device=device,
        backend=backend,
        chunk_size=chunk_size,
    )
    if res.num_excluded:
        log.info(
            "%s: %d of %d queries have no other item of their class and are excluded",
            embeddings_path,
            res.num_excluded,
            len(query),
        )
    return res


def _nmi(embeddings, labels, nmi: bool | Mapping[str, Any], *, seed: int, average_method: str) -> float:
    """k-means NMI with the ``eval.nmi`` options, or with `average_method` and faiss k-means for ``nmi=True``."""
    opts = nmi_options(nmi) if isinstance(nmi, Mapping) else {"average": average_method, "kmeans": "faiss"}
    return nmi_score(
        embeddings,
        labels,
        seed=seed,
        average_method=opts["average"],
        kmeans=opts["kmeans"],
        n_init=opts.get("n_init", 10),
    )


def _add_extra_metrics(metrics: dict[str, float], extra_metrics: Mapping[str, float] | None) -> None:
    """Merge values computed elsewhere (W2, AvgDTP) into `metrics`; a name may not repeat a computed one."""
    for key, value in dict(extra_metrics or {}).items():
        if key in metrics:
            raise ValueError(f"extra metric {key!r} collides with a computed metric")
        metrics[key] = float(value)
