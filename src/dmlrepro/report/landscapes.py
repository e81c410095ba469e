"""The analytic loss landscapes the report draws (no training): RSW's per-sample loss over the
plane (RSW Fig. 3/5) and PFML's class fields of a 2-D toy (PFML main Fig. 2). Both evaluate the
loss modules themselves (dmlrepro.losses); report.figures only draws what these return."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from dmlrepro.losses.distances import pairwise_distances
from dmlrepro.losses.rsw import RSWLoss

#: how the landscape reads eq. 7's Δ on [0, α) (rsw_landscape)
DELTA_MODES = ("value", "continuous", "none")
#: the RSWLoss arguments that shape the warp (other loss hyperparameters, e.g. scale, are not read)
WARP_KEYS = ("alpha", "k1", "k2", "delta_scale", "warp", "function", "power", "use_delta")


def rsw_landscape(
    points: np.ndarray,
    proxies: np.ndarray,
    hparams: Mapping,
    *,
    ground_truth: int = 0,
    scale: float = 1.0,
    delta: str = "value",
) -> np.ndarray:
    """RSW's per-sample loss (eq. 8; eqs. 5/6 with two proxies) at each row of `points` (N, 2)
    with fixed `proxies` (C, 2) and class `ground_truth`: log(1 + Σ_{j≠gt} exp(s·[f1(t_gt) − f2(t_j)])),
    in float64, f1 and f2 from RSWLoss.warped_distances (`hparams`: the loss's; missing alpha, k1,
    k2 as in Table III's rows: 0, 1, 1). `delta` reads Δ on [0, α): "value" = the forward value
    k1·t + k·(1 − k1)·t (what RSWLoss computes; = t for k = 1, the landscape of eq. 4 there),
    "continuous" = k1·t + (1 − k1)·α (RSW-R20: continuous, with eq. 7's slopes, the
    "approximation" the caption names), "none" = k1·t."""
    if delta not in DELTA_MODES:
        raise ValueError(f"delta {delta!r}: expected one of {DELTA_MODES}")
    warp = {"alpha": 0.0, "k1": 1.0, "k2": 1.0, **{k: hparams[k] for k in WARP_KEYS if k in hparams}}
    reads_delta = warp.get("use_delta", True) and warp.get("warp", True) and warp.get("function", "warp") == "warp"
    proxies = np.asarray(proxies, np.float64)
    loss = RSWLoss(len(proxies), proxies.shape[1], **{**warp, "use_delta": reads_delta and delta == "value"})
    e = torch.as_tensor(np.asarray(points, np.float64))
    with torch.no_grad():
        loss.proxies.data = torch.as_tensor(proxies)
        f = loss.warped_distances(e, torch.full((len(e),), ground_truth, dtype=torch.long)).numpy()
        if reads_delta and delta == "continuous" and math.isfinite(warp["alpha"]):
            t = pairwise_distances(e, loss.proxies)[:, ground_truth].numpy()
            f[:, ground_truth] += np.where(t < warp["alpha"], (1.0 - warp["k1"]) * warp["alpha"], 0.0)
    z = scale * (f[:, [ground_truth]] - np.delete(f, ground_truth, axis=1))  # (N, C - 1)
    top = np.maximum(z.max(axis=1), 0.0)
    return top + np.log(np.exp(-top) + np.exp(z - top[:, None]).sum(axis=1))


def landscape_panels(
    panels: Sequence[Mapping],
    proxies: np.ndarray,
    *,
    extent: Sequence[float],
    ground_truth: int = 0,
    scale: float = 1.0,
    grid: int = 161,
) -> list[dict]:
    """RSW Fig. 3/5: for each panel (`title`, `hparams`, `delta`) the loss landscape on a `grid` ×
    `grid` grid over `extent` (x0, x1, y0, y1): `title`, `x`, `y`, `values` (grid × grid)."""
    x0, x1, y0, y1 = extent
    xs, ys = np.linspace(x0, x1, grid), np.linspace(y0, y1, grid)
    points = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2)
    return [
        {
            "title": panel["title"],
            "x": xs,
            "y": ys,
            "values": rsw_landscape(
                points,
                proxies,
                panel["hparams"],
                ground_truth=ground_truth,
                scale=scale,
                delta=panel.get("delta", "value"),
            ).reshape(grid, grid),
        }
        for panel in panels
    ]


def class_field(loss, r: np.ndarray, sources: np.ndarray, source_labels: np.ndarray, cls: int):
    """Ψ_cls(r) of PFML eqs. (3)–(5) (unit charges: ψ_att from class `cls`, ψ_rep from the others)
    and the net force −∇Ψ_cls(r), at the rows of `r`, in float64; `loss` supplies ψ_att / ψ_rep
    (`attraction`, `repulsion`)."""
    at = torch.tensor(r, dtype=torch.float64, requires_grad=True)
    d = torch.cdist(at, torch.tensor(sources, dtype=torch.float64))
    psi = torch.where(torch.tensor(source_labels == cls), loss.attraction(d), loss.repulsion(d)).sum(1)
    (force,) = torch.autograd.grad(-psi.sum(), at)
    return psi.detach().numpy(), force.numpy()


def toy_configuration(seed: int = 0):
    """The toy of PFML main Fig. 2: two classes, class 2 with a far variant point, 2 proxies each."""
    rng = np.random.default_rng(seed)
    c1 = rng.normal([-0.35, 0.1], 0.08, (5, 2))
    c2 = np.concatenate([rng.normal([0.35, -0.1], 0.08, (4, 2)), [[-0.1, 0.7]]])  # a variant / mislabelled point
    points = np.concatenate([c1, c2])
    labels = np.array([0] * 5 + [1] * 5)
    proxies = np.array([[-0.6, -0.5], [0.0, 0.15], [0.6, 0.5], [0.1, -0.6]])
    return points, labels, proxies, np.array([0, 0, 1, 1])


def toy_fields(
    loss,
    points: np.ndarray,
    labels: np.ndarray,
    proxies: np.ndarray,
    proxy_labels: np.ndarray,
    *,
    extent: float = 1.0,
    grid: int = 121,
) -> dict:
    """PFML main Fig. 2: the class field Ψ_j and the net force −∇Ψ_j of each class j of the toy on a
    `grid` × `grid` grid over [−extent, extent]²: `axis`, `points`, `labels`, `proxies`,
    `proxy_labels`, and `fields` = [(class, Ψ (grid, grid), force (grid, grid, 2))]."""
    sources = np.concatenate([points, proxies])
    source_labels = np.concatenate([labels, proxy_labels])
    axis = np.linspace(-extent, extent, grid)
    r = np.stack(np.meshgrid(axis, axis), -1).reshape(-1, 2)
    fields = []
    for cls in dict.fromkeys(labels.tolist()):
        psi, force = class_field(loss, r, sources, source_labels, cls)
        fields.append((cls, psi.reshape(grid, grid), force.reshape(grid, grid, 2)))
    return {
        "axis": axis,
        "points": points,
        "labels": labels,
        "proxies": proxies,
        "proxy_labels": proxy_labels,
        "fields": fields,
    }
