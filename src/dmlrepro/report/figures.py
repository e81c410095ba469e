"""The report's figures (matplotlib, Agg, PNG): ablation sweeps with error bars (PFML Fig. 3), the
retrieval grid (PFML supp. Fig. 1), a t-SNE of test embeddings (supp. Fig. 2), the 2-D toy
class fields of a potential-field loss (main Fig. 2) and improvement bars over a base loss (ASAP Fig. 5)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from PIL import Image  # noqa: E402

from dmlrepro.atomic import atomic_open  # noqa: E402

from .aggregate import sweep_points  # noqa: E402
from .reported import is_stand_in, paper_units  # noqa: E402

DPI = 110


def _save(fig, path: str | os.PathLike) -> None:
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def sweep_figure(
    aggregated: pd.DataFrame,
    key: str,
    metric: str,
    path: str | os.PathLike,
    *,
    x_label: str | None = None,
    datasets: Mapping[str, str] | None = None,
    x_offset: float = 0.0,
) -> None:
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


def tsne_2d(points: np.ndarray, seed: int) -> np.ndarray:
    """2-D t-SNE (scikit-learn, PCA init, fixed seed; perplexity 30, or (n − 1) / 3 for few points)."""
    from sklearn.manifold import TSNE  # deferred: scikit-learn (seconds), only the t-SNE figure

    return TSNE(
        n_components=2, init="pca", random_state=seed, perplexity=min(30.0, max(2.0, (len(points) - 1) / 3))
    ).fit_transform(points)


def tsne_figure(
    embeddings: np.ndarray,
    labels: np.ndarray,
    path: str | os.PathLike,
    *,
    seed: int = 0,
    max_points: int = 2000,
    title: str = "",
) -> None:
    """A t-SNE (scikit-learn, fixed seed) of at most `max_points` embeddings (a seeded subset),
    coloured by class."""
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.permutation(len(labels))[:max_points])
    points = tsne_2d(embeddings[keep], seed)
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.scatter(points[:, 0], points[:, 1], c=labels[keep], cmap="tab20", s=6)
    ax.set_xticks([]), ax.set_yticks([])
    ax.set_title(title or f"t-SNE of {len(keep)} test embeddings", fontsize=9)
    _save(fig, path)


def toy_field_figure(toy: Mapping, path: str | os.PathLike) -> None:
    """PFML main Fig. 2: the class fields Ψ_j of a 2-D toy (report.landscapes.toy_fields), one panel
    per class, with the net force −∇Ψ_j as arrows (direction only)."""
    axis, points, labels = toy["axis"], toy["points"], toy["labels"]
    proxies, proxy_labels = toy["proxies"], toy["proxy_labels"]
    fig, axes = plt.subplots(1, len(toy["fields"]), figsize=(4.4 * len(toy["fields"]), 4), squeeze=False)
    for ax, (cls, psi, force) in zip(axes[0], toy["fields"]):
        shown = np.sign(psi) * np.log10(1.0 + np.abs(psi))  # ψ_rep reaches d_floor^−α: a log scale shows both
        filled = ax.contourf(axis, axis, shown, levels=30, cmap="viridis")
        fig.colorbar(filled, ax=ax, shrink=0.8, label="sign(Ψ)·log10(1 + |Ψ|)")
        step = max(1, len(axis) // 20)
        f = force[::step, ::step]
        norm = np.hypot(f[..., 0], f[..., 1]) + 1e-12
        ax.quiver(
            axis[::step],
            axis[::step],
            f[..., 0] / norm,
            f[..., 1] / norm,
            color="white",
            alpha=0.6,
            scale=30,
            width=0.004,
        )
        own = labels == cls
        ax.scatter(points[own, 0], points[own, 1], marker="o", c="red", s=30)
        ax.scatter(points[~own, 0], points[~own, 1], marker="x", c="black", s=30)
        mine = proxy_labels == cls
        ax.scatter(proxies[mine, 0], proxies[mine, 1], marker="*", c="gold", s=140, edgecolors="black")
        ax.scatter(proxies[~mine, 0], proxies[~mine, 1], marker="*", c="grey", s=140, edgecolors="black")
        ax.set_title(f"Ψ{cls + 1} (class {cls + 1}: o, other: x, proxies: ★)", fontsize=9)
        ax.set_aspect("equal")
    _save(fig, path)


# -- RSW: per-epoch curves (Fig. 9), heat maps over two sweep keys (Fig. 7), the analytic loss
# -- landscape of the warping functions (Fig. 3/5) and 2-D embeddings with proxies (Fig. 10)


def curves_figure(curves: Sequence[dict], path: str | os.PathLike, *, y_label: str, title: str = "") -> None:
    """One line per entry of `curves` (`label`, `epoch`, `value`: arrays of equal length) against
    the epoch; a curve that stops early (a diverged run) ends with a cross."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for curve in curves:
        (line,) = ax.plot(curve["epoch"], curve["value"], marker="o", ms=3, label=curve["label"])
        if curve.get("diverged") and len(curve["epoch"]):
            ax.plot(curve["epoch"][-1], curve["value"][-1], marker="x", ms=10, color=line.get_color())
    ax.set_xlabel("epoch (0 = untrained)")
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    if title:
        ax.set_title(title, fontsize=9)
    _save(fig, path)


def heatmap_grid(aggregated: pd.DataFrame, x: str, y: str, metric: str) -> tuple[list, list, np.ndarray]:
    """(x values, y values, grid[y, x]) of `<metric>_mean` (paper units) over two swept keys; NaN
    where a grid point has no finite value."""
    frame = aggregated.assign(_x=sweep_points(aggregated, x), _y=sweep_points(aggregated, y))
    xs, ys = sorted(set(frame["_x"])), sorted(set(frame["_y"]))
    grid = np.full((len(ys), len(xs)), np.nan)
    for row in frame.to_dict("records"):
        grid[ys.index(row["_y"]), xs.index(row["_x"])] = paper_units(metric, float(row[f"{metric}_mean"]))
    return xs, ys, grid


def heatmap_figure(
    aggregated: pd.DataFrame,
    x: str,
    y: str,
    metric: str,
    path: str | os.PathLike,
    *,
    x_label: str | None = None,
    y_label: str | None = None,
    title: str = "",
) -> None:
    """`metric` (mean over seeds, paper units) over the grid of two swept keys, values printed."""
    xs, ys, grid = heatmap_grid(aggregated, x, y, metric)
    fig, ax = plt.subplots(figsize=(1.1 * len(xs) + 2.2, 0.8 * len(ys) + 1.6))
    shown = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap="viridis", aspect="auto")
    fig.colorbar(shown, ax=ax, label=metric + (" (%)" if paper_units(metric, 1.0) == 100.0 else ""))
    for (i, j), value in np.ndenumerate(grid):
        ax.text(
            j,
            i,
            "–" if np.isnan(value) else f"{value:.3g}",
            ha="center",
            va="center",
            fontsize=8,
            color="white" if np.isnan(value) or value < np.nanmean(grid) else "black",
        )
    ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs])
    ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
    ax.set_xlabel(x_label or x)
    ax.set_ylabel(y_label or y)
    if title:
        ax.set_title(title, fontsize=9)
    _save(fig, path)


def landscape_figure(
    panels: Sequence[Mapping], proxies: np.ndarray, path: str | os.PathLike, *, ground_truth: int = 0
) -> None:
    """RSW Fig. 3/5: one panel per entry of `panels` (report.landscapes.landscape_panels: `title`,
    `x`, `y`, `values`), the loss landscape over the plane with the proxies marked (ground truth:
    gold star) and the grid's minimum (red +)."""
    proxies = np.asarray(proxies, dtype=np.float64)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        xs, ys, values = panel["x"], panel["y"], panel["values"]
        filled = ax.contourf(xs, ys, values, levels=30, cmap="viridis")
        ax.contour(xs, ys, values, levels=12, colors="white", linewidths=0.4, alpha=0.6)
        fig.colorbar(filled, ax=ax, shrink=0.8)
        best = np.unravel_index(np.argmin(values), values.shape)
        ax.plot(xs[best[1]], ys[best[0]], marker="+", color="red", ms=12, mew=2)
        others = np.arange(len(proxies)) != ground_truth
        ax.scatter(proxies[others, 0], proxies[others, 1], marker="*", c="grey", s=160, edgecolors="black")
        ax.scatter(*proxies[ground_truth], marker="*", c="gold", s=200, edgecolors="black")
        ax.set_title(panel["title"], fontsize=9)
        ax.set_aspect("equal")
    _save(fig, path)


def embedding_2d_figure(panels: Sequence[dict], path: str | os.PathLike) -> None:
    """RSW Fig. 10: per panel (`title`, `embeddings` (N, 2), `labels`, `proxies` (C, 2),
    `proxy_labels`) the embeddings coloured by class and the proxies as stars of their class's
    colour (grey where no embedding has that class)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        emb, labels = np.asarray(panel["embeddings"]), np.asarray(panel["labels"])
        if emb.ndim != 2 or emb.shape[1] != 2:
            raise ValueError(
                f"embedding_2d: {panel['title']}: embeddings of shape {emb.shape}, expected (N, 2) "
                f"(set model.embedding_size: 2)"
            )
        classes = sorted(set(labels.tolist()) | set(np.asarray(panel["proxy_labels"]).tolist()))
        colour = {c: plt.cm.tab10(i % 10) for i, c in enumerate(classes)}
        ax.scatter(emb[:, 0], emb[:, 1], c=[colour[c] for c in labels.tolist()], s=6, alpha=0.6)
        seen = set(labels.tolist())
        for p, c in zip(np.asarray(panel["proxies"]), np.asarray(panel["proxy_labels"]).tolist()):
            ax.scatter(
                p[0], p[1], marker="*", s=220, edgecolors="black", c=[colour[c] if c in seen else (0.6, 0.6, 0.6, 1.0)]
            )
        ax.set_title(panel["title"], fontsize=9)
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.3)
    _save(fig, path)


def histogram_figure(
    values: Sequence[float], path: str | os.PathLike, *, x_label: str, title: str = "", unit: float | None = None
) -> None:
    """A histogram of `values` (ASAP Fig. 4b: steps per projection); bins of width `unit` when given."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    values = np.asarray(values, dtype=float)
    if unit:
        bins = np.arange(values.min() - unit / 2, values.max() + unit, unit) if len(values) else 10
    else:
        bins = "auto"
    ax.hist(values, bins=bins, color="tab:blue", edgecolor="black")
    ax.set_xlabel(x_label)
    ax.set_ylabel("count")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    _save(fig, path)


def projection_geometry_figure(panels: Sequence[dict], path: str | os.PathLike, *, seed: int = 0) -> None:
    """ASAP Fig. 7: per panel (`title`, `embeddings`, `labels`, `annotation`) a 2-D t-SNE of the
    validation embeddings, coloured by class, annotated with its numbers."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        xy = tsne_2d(np.asarray(panel["embeddings"], dtype=np.float32), seed)
        ax.scatter(xy[:, 0], xy[:, 1], c=np.asarray(panel["labels"]) % 20, cmap="tab20", s=5)
        ax.set_title(panel["title"], fontsize=9)
        ax.text(
            0.02,
            0.02,
            panel["annotation"],
            transform=ax.transAxes,
            fontsize=8,
            va="bottom",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
        )
        ax.set_xticks([])
        ax.set_yticks([])
    _save(fig, path)


def search_surface_figure(
    surface,
    path: str | os.PathLike,
    *,
    x_label: str,
    y_label: str,
    title: str = "",
    value_label: str = "validation MAP@R",
) -> None:
    """A Bayesian search's GP posterior mean over two searched keys (tuning.posterior_surface), the
    trials as points and the best one starred, as ASAP Fig. 2 ("Gaussian Process Regression to
    Parameter Space"). A value 0 on a log axis sits at the surface's x_zero / y_zero (marked)."""
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    shown = ax.contourf(surface.X, surface.Y, surface.mean, levels=20, cmap="viridis")
    fig.colorbar(shown, ax=ax, label=f"GP posterior mean of the {value_label}")
    ax.scatter(surface.x_obs, surface.y_obs, c="white", edgecolors="black", s=22, label="trials")
    best = int(np.argmax(surface.values))
    ax.scatter(
        [surface.x_obs[best]],
        [surface.y_obs[best]],
        marker="*",
        c="red",
        s=160,
        edgecolors="black",
        label=f"best ({surface.values[best]:.3g})",
    )
    for zero, line in ((surface.x_zero, ax.axvline), (surface.y_zero, ax.axhline)):
        if zero is not None:
            line(zero, color="white", ls=":", lw=1)
    ax.set_xlabel(x_label + (" (dotted: 0)" if surface.x_zero is not None else ""))
    ax.set_ylabel(y_label + (" (dotted: 0)" if surface.y_zero is not None else ""))
    ax.legend(fontsize=7, loc="best")
    if title:
        ax.set_title(title, fontsize=9)
    _save(fig, path)


def improvement_figure(
    rows: Sequence[Mapping], path: str | os.PathLike, *, y_label: str, datasets: Mapping[str, str] | None = None
) -> None:
    """ASAP Fig. 5 (ASAP-R22): one panel per dataset, a bar per method holding its metric, bars grouped by
    base loss (the base first, grey; its variants green where they improve on it, red where not),
    each variant annotated with its absolute Δ over the base (and Δ in % of the base); a method with
    no base loss among the methods (SoftTriple) stands alone, hatched.

    `rows`: section_data.improvement_rows' output (`dataset`, `sweep`, `label`, `group`, `role` base /
    variant / alone, `value`, `delta`, `delta_pct`), in the order to draw."""
    panels = list(dict.fromkeys((r["dataset"], r["sweep"]) for r in rows))
    width = max((sum(1 for r in rows if (r["dataset"], r["sweep"]) == p) for p in panels), default=1)
    fig, axes = plt.subplots(
        1, max(len(panels), 1), figsize=(max(4.5, 0.55 * width + 1.5) * max(len(panels), 1), 4.2), squeeze=False
    )
    for ax, (dataset, sweep) in zip(axes[0], panels):
        mine = [r for r in rows if (r["dataset"], r["sweep"]) == (dataset, sweep)]
        x, next_x, ticks, previous = [], 0.0, [], None
        for r in mine:
            if previous is not None and r["group"] != previous:
                next_x += 0.6  # a gap between base-loss groups
            x.append(next_x)
            ticks.append(r["label"])
            previous, next_x = r["group"], next_x + 1.0
        values = [np.nan if r["value"] is None else r["value"] for r in mine]
        colours = [
            "0.6"
            if r["role"] != "variant"
            else ("0.85" if r["delta"] is None else "tab:green" if r["delta"] >= 0 else "tab:red")
            for r in mine
        ]
        bars = ax.bar(x, values, color=colours, edgecolor="black", width=0.8)
        for bar, r in zip(bars, mine):
            if r["role"] == "alone":  # no base loss among the methods: drawn for comparison
                bar.set_facecolor("white")
                bar.set_hatch("//")
        finite = [v for v in values if np.isfinite(v)]
        top = max(finite, default=1.0)
        for xi, r, v in zip(x, mine, values):
            if r["role"] == "variant" and r["delta"] is not None and np.isfinite(v):
                text = f"{r['delta']:+.2f}" + ("" if r["delta_pct"] is None else f"\n({r['delta_pct']:+.1f} %)")
                ax.annotate(
                    text, (xi, v), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7
                )
        ax.set_ylim(0, top * 1.18 if top > 0 else 1.0)
        ax.set_xticks(x)
        ax.set_xticklabels(ticks, rotation=60, ha="right", fontsize=8)
        name = (datasets or {}).get(dataset, dataset)
        if name != dataset and is_stand_in(dataset, name):
            name = f"{name} (stand-in: {dataset})"
        ax.set_title(f"{name} ({sweep})" if sweep else name)
        ax.set_ylabel(y_label)
        ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def projection_radius_figure(curves: Sequence[Mapping], path: str | os.PathLike, *, title: str = "") -> None:
    """ASAP Fig. 1's covering radius per projection: one line per entry of `curves` (`label`,
    `projection`, `radius`), projection 0 being single proxy-based training."""
    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for curve in curves:
        ax.plot(curve["projection"], curve["radius"], marker="o", ms=4, label=curve["label"])
    ax.set_xlabel("projection (0 = single proxy-DML; K = after alternation K)")
    ax.set_ylabel("average covering radius (App. A.3.1)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    _save(fig, path)
