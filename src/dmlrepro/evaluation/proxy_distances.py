"""Proxy–data distances: PFML Table 3's W₂ (docs/readings/pfml.md#pfml-r24) and RSW's AvgDTP (Eq. 9,
docs/readings/rsw.md#rsw-r15).

Both are plain functions over (embeddings, labels, proxies, proxy labels); the caller decides
which split and which space (e.g. L2-normalise the proxies of cosine-based losses such as
ProxyNCA, Proxy-Anchor and SoftTriple before measuring — docs/readings/pfml.md#pfml-r24).
Computation in float64.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .knn import to_label_vector


def _as_matrix64(x: Any, name: str) -> np.ndarray:
    if type(x).__module__.startswith("torch"):
        x = x.detach().to("cpu").double().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return arr


def _pairwise_euclidean(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from scipy.spatial.distance import cdist  # noqa: PLC0415  (deferred: scipy, only these measures need it)

    return cdist(a, b, metric="euclidean")


def proxy_data_w2_per_class(
    embeddings: Any,
    labels: Any,
    proxies: Any,
    proxy_labels: Any,
    *,
    w_power: int = 1,
) -> dict[Any, float]:
    """W_j for every class j that has proxies (PFML supp. §2; docs/readings/pfml.md#pfml-r24).

    W_j = min over injective π: {1..m} → Z_j of (1/m) Σ_k ‖p_{j,k} − z_{π(k)}‖₂   (w_power=1,
    the printed formula, a W₁-type mean distance), or
    W_j = sqrt( min_π (1/m) Σ_k ‖p_{j,k} − z_{π(k)}‖₂² )                          (w_power=2,
    a true W₂). The optimal injective map is a rectangular assignment
    (scipy.optimize.linear_sum_assignment on the m × |Z_j| cost). m = 1 reduces to the distance
    from the proxy to its class's closest embedding (the paper's footnote 2).

    If a class has fewer embeddings than proxies (|Z_j| < m, possible on tiny generated data
    only), every embedding is matched to a distinct proxy and the mean is over the |Z_j| matched
    pairs; a warning names the classes.
    """
    from scipy.optimize import linear_sum_assignment  # noqa: PLC0415  (deferred: scipy, only these measures need it)

    if w_power not in (1, 2):
        raise ValueError(f"w_power must be 1 (mean distance, as printed) or 2 (true W2), got {w_power!r}")
    z = _as_matrix64(embeddings, "embeddings")
    p = _as_matrix64(proxies, "proxies")
    if p.shape[0] == 0:
        raise ValueError("proxies is empty: the W2 proxy-data distance needs at least one proxy")
    if p.shape[1] != z.shape[1]:
        raise ValueError(f"proxy dimension {p.shape[1]} differs from embedding dimension {z.shape[1]}")
    y = to_label_vector(labels, z.shape[0], "labels")
    py = to_label_vector(proxy_labels, p.shape[0], "proxy_labels")
    out: dict[Any, float] = {}
    short: list[Any] = []
    for c in np.unique(py):
        pc = p[py == c]
        zc = z[y == c]
        if zc.shape[0] == 0:
            raise ValueError(f"class {c!r} has {pc.shape[0]} proxies but no embeddings")
        dist = _pairwise_euclidean(pc, zc)
        cost = dist if w_power == 1 else dist**2
        rows, cols = linear_sum_assignment(cost)
        pairs = len(rows)
        if pairs < pc.shape[0]:
            short.append(c)
        mean_cost = cost[rows, cols].sum() / pairs
        out[c.item() if hasattr(c, "item") else c] = float(mean_cost if w_power == 1 else np.sqrt(mean_cost))
    if short:
        warnings.warn(
            f"{len(short)} class(es) have fewer embeddings than proxies (e.g. {short[:5]}): W2 "
            "averaged over the matched pairs only",
            stacklevel=2,
        )
    return out


def proxy_data_w2(
    embeddings: Any,
    labels: Any,
    proxies: Any,
    proxy_labels: Any,
    *,
    w_power: int = 1,
) -> float:
    """Mean over classes of :func:`proxy_data_w2_per_class` (PFML Table 3 value of one run).

    ``proxy_labels[i]`` is the class of ``proxies[i]``; for PFML's layout (row j·M + k = proxy k
    of class j) use :func:`pfml_proxy_labels`.
    """
    per_class = proxy_data_w2_per_class(embeddings, labels, proxies, proxy_labels, w_power=w_power)
    return float(np.mean(list(per_class.values())))


def pfml_proxy_labels(num_classes: int, proxies_per_class: int) -> np.ndarray:
    """Class of each proxy row in the PFML/CPML layout: row j·M + k belongs to class j."""
    return np.repeat(np.arange(num_classes, dtype=np.int64), proxies_per_class)


def avg_dtp_per_class(
    embeddings: Any,
    labels: Any,
    proxies: Any,
    proxy_labels: Any = None,
) -> dict[Any, float]:
    """(1/|P_c|) Σ_{e∈P_c} ‖e − p_c‖ for each class c present in ``labels`` (RSW Eq. 9).

    One proxy per class. ``proxy_labels=None`` means row c of ``proxies`` is the proxy of class
    c (RSW's layout; labels must then be integers in [0, len(proxies))).
    """
    z = _as_matrix64(embeddings, "embeddings")
    p = _as_matrix64(proxies, "proxies")
    if p.shape[1] != z.shape[1]:
        raise ValueError(f"proxy dimension {p.shape[1]} differs from embedding dimension {z.shape[1]}")
    y = to_label_vector(labels, z.shape[0], "labels")
    if proxy_labels is None:
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= p.shape[0]:
            raise ValueError(
                f"without proxy_labels, labels must be integers in [0, {p.shape[0]}) (row c of proxies = class c)"
            )
        own = p[y]
    else:
        py = to_label_vector(proxy_labels, p.shape[0], "proxy_labels")
        uniq, first = np.unique(py, return_index=True)
        if len(uniq) != len(py):
            raise ValueError("AvgDTP is defined for one proxy per class; proxy_labels has repeats")
        proxy_index = np.clip(np.searchsorted(uniq, y), 0, len(uniq) - 1)
        missing = uniq[proxy_index] != y
        if missing.any():
            raise ValueError(f"labels without a proxy: {np.unique(y[missing])[:5].tolist()}")
        own = p[first[proxy_index]]
    d = np.linalg.norm(z - own, axis=1)
    classes, codes = np.unique(y, return_inverse=True)
    means = np.bincount(codes.reshape(-1), weights=d) / np.bincount(codes.reshape(-1))
    return {(c.item() if hasattr(c, "item") else c): float(m) for c, m in zip(classes, means)}


def avg_dtp(embeddings: Any, labels: Any, proxies: Any, proxy_labels: Any = None) -> float:
    """AvgDTP = (1/C) Σ_c (1/|P_c|) Σ_{e∈P_c} ‖e − p_c‖ over the classes present in ``labels``
    (docs/readings/rsw.md#rsw-r15; classes without samples are left out since 1/|P_c| is undefined)."""
    return float(np.mean(list(avg_dtp_per_class(embeddings, labels, proxies, proxy_labels).values())))
