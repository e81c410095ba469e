"""The report's figures (matplotlib, Agg, PNG): ablation sweeps with error bars (PFML Fig. 3), the
retrieval grid (PFML supp. Fig. 1), a t-SNE of test embeddings (supp. Fig. 2) and the 2-D toy
class fields of a potential-field loss (main Fig. 2)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .reported import paper_units  # noqa: E402

DPI = 110


def _save(fig, path: str | os.PathLike) -> None:
    from dmlrepro.atomic import atomic_open

    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def sweep_points(aggregated: pd.DataFrame, key: str) -> pd.Series:
    """The swept value of `key` in each row of an aggregated table (its `sweep` column)."""
    import yaml

    def value(sweep):
        for part in str(sweep or "").split(", "):
            name, _, text = part.partition("=")
            if name == key:
                return yaml.safe_load(text)
        raise ValueError(f"sweep {sweep!r} has no key {key!r}")

    return aggregated["sweep"].map(value)


def sweep_figure(aggregated: pd.DataFrame, key: str, metric: str, path: str | os.PathLike, *,
                 x_label: str | None = None, datasets: Mapping[str, str] | None = None,
                 x_offset: float = 0.0) -> None:
    """`metric` (mean ± std over seeds, paper units) against the swept `key`, one panel per
    dataset and one line per method, as PFML Fig. 3. `x_offset` is subtracted from x (Fig. 3d
    plots δ_rep − δ_att)."""
    frame = aggregated.assign(x=sweep_points(aggregated, key).astype(float) - x_offset)
    names = list(dict.fromkeys(frame["dataset"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
    for ax, dataset in zip(axes[0], names):
        for method, rows in frame[frame["dataset"] == dataset].groupby("method", sort=False):
            rows = rows.sort_values("x")
            mean = rows[f"{metric}_mean"].map(lambda v: paper_units(metric, v))
            std = rows[f"{metric}_std"].map(lambda v: paper_units(metric, v)).fillna(0.0)
            ax.errorbar(rows["x"], mean, yerr=std, marker="o", capsize=3, label=method)
        ax.set_title((datasets or {}).get(dataset, dataset))
        ax.set_xlabel(x_label or key)
        ax.set_ylabel(metric + (" (%)" if paper_units(metric, 1.0) == 100.0 else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def retrieval_grid(queries: Sequence[dict], path: str | os.PathLike, title: str = "") -> None:
    """Rows of [query, neighbour 1..k] thumbnails; neighbours framed green (same class) or red.

    Each query dict: `image` (path), `label`, `neighbours` = [(image path, label), ...]."""
    from PIL import Image

    k = max(len(q["neighbours"]) for q in queries)
    fig, axes = plt.subplots(len(queries), k + 1, figsize=(1.6 * (k + 1), 1.7 * len(queries)), squeeze=False)
    for row, query in zip(axes, queries):
        cells = [(query["image"], None)] + [(img, lab == query["label"]) for img, lab in query["neighbours"]]
        for ax, (image, correct) in zip(row, cells + [(None, None)] * (k + 1 - len(cells))):
            ax.set_xticks([]), ax.set_yticks([])
            if image is None:
                ax.axis("off")
                continue
            with Image.open(image) as img:
                ax.imshow(np.asarray(img.convert("RGB")))
            colour = "black" if correct is None else ("#1a9641" if correct else "#d7191c")
            for side in ax.spines.values():
                side.set_edgecolor(colour), side.set_linewidth(4)
        row[0].set_ylabel("query", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    _save(fig, path)


def tsne_figure(embeddings: np.ndarray, labels: np.ndarray, path: str | os.PathLike, *, seed: int = 0,
                max_points: int = 2000, title: str = "") -> None:
    """A t-SNE (scikit-learn, fixed seed) of at most `max_points` embeddings (a seeded subset),
    coloured by class."""
    from sklearn.manifold import TSNE

    rng = np.random.default_rng(seed)
    keep = np.sort(rng.permutation(len(labels))[:max_points])
    points = TSNE(n_components=2, init="pca", random_state=seed,
                  perplexity=min(30.0, max(2.0, (len(keep) - 1) / 3))).fit_transform(embeddings[keep])
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(points[:, 0], points[:, 1], c=labels[keep], cmap="tab20", s=6)
    ax.set_xticks([]), ax.set_yticks([])
    ax.set_title(title or f"t-SNE of {len(keep)} test embeddings", fontsize=9)
    _save(fig, path)


def class_field(loss, r: np.ndarray, sources: np.ndarray, source_labels: np.ndarray, cls: int):
    """Ψ_cls(r) of eqs. (3)–(5) (unit charges: ψ_att from class `cls`, ψ_rep from the others) and the
    net force −∇Ψ_cls(r), at the rows of `r`, in float64."""
    import torch

    at = torch.tensor(r, dtype=torch.float64, requires_grad=True)
    d = torch.cdist(at, torch.tensor(sources, dtype=torch.float64))
    psi = torch.where(torch.tensor(source_labels == cls), loss.attraction(d), loss.repulsion(d)).sum(1)
    (force,) = torch.autograd.grad(-psi.sum(), at)
    return psi.detach().numpy(), force.numpy()


def toy_field_figure(loss, points: np.ndarray, labels: np.ndarray, proxies: np.ndarray, proxy_labels: np.ndarray,
                     path: str | os.PathLike, *, extent: float = 1.0, grid: int = 121) -> None:
    """PFML main Fig. 2: the class fields Ψ_j of a 2-D toy, one panel per class, with the net force
    −∇Ψ_j as arrows (direction only). `loss` supplies ψ_att / ψ_rep (`attraction`, `repulsion`)."""
    sources = np.concatenate([points, proxies])
    source_labels = np.concatenate([labels, proxy_labels])
    axis = np.linspace(-extent, extent, grid)
    r = np.stack(np.meshgrid(axis, axis), -1).reshape(-1, 2)
    classes = list(dict.fromkeys(labels.tolist()))
    fig, axes = plt.subplots(1, len(classes), figsize=(4.4 * len(classes), 4), squeeze=False)
    for ax, cls in zip(axes[0], classes):
        psi, force = class_field(loss, r, sources, source_labels, cls)
        shown = np.sign(psi) * np.log10(1.0 + np.abs(psi))  # ψ_rep reaches d_floor^−α: a log scale shows both
        filled = ax.contourf(axis, axis, shown.reshape(grid, grid), levels=30, cmap="viridis")
        fig.colorbar(filled, ax=ax, shrink=0.8, label="sign(Ψ)·log10(1 + |Ψ|)")
        step = max(1, grid // 20)
        f = force.reshape(grid, grid, 2)[::step, ::step]
        norm = np.hypot(f[..., 0], f[..., 1]) + 1e-12
        ax.quiver(axis[::step], axis[::step], f[..., 0] / norm, f[..., 1] / norm, color="white", alpha=0.6,
                  scale=30, width=0.004)
        own = labels == cls
        ax.scatter(points[own, 0], points[own, 1], marker="o", c="red", s=30)
        ax.scatter(points[~own, 0], points[~own, 1], marker="x", c="black", s=30)
        mine = proxy_labels == cls
        ax.scatter(proxies[mine, 0], proxies[mine, 1], marker="*", c="gold", s=140, edgecolors="black")
        ax.scatter(proxies[~mine, 0], proxies[~mine, 1], marker="*", c="grey", s=140, edgecolors="black")
        ax.set_title(f"Ψ{cls + 1} (class {cls + 1}: o, other: x, proxies: ★)", fontsize=9)
        ax.set_aspect("equal")
    _save(fig, path)


def toy_configuration(seed: int = 0):
    """The toy of main Fig. 2: two classes, class 2 with a far variant point, 2 proxies each."""
    rng = np.random.default_rng(seed)
    c1 = rng.normal([-0.35, 0.1], 0.08, (5, 2))
    c2 = np.concatenate([rng.normal([0.35, -0.1], 0.08, (4, 2)), [[-0.1, 0.7]]])  # a variant / mislabelled point
    points = np.concatenate([c1, c2])
    labels = np.array([0] * 5 + [1] * 5)
    proxies = np.array([[-0.6, -0.5], [0.0, 0.15], [0.6, 0.5], [0.1, -0.6]])
    return points, labels, proxies, np.array([0, 0, 1, 1])
