"""ASAP Fig. 1's mechanism measured on a run's saved outputs (report kind `proxy_geometry`, ASAP Sec. 5.2):
"when single proxy-based method is converged (Fig. 1-(a)), the class proxies collapse to a single
point. Once we continue training with proposed approach (Fig. 1-(b)), the covering radius decreases".

Per run, in the space its evaluation measures (run config `eval.normalize`; ASAP: v / max(1, ‖v‖),
Sec. 4.4, applied to embeddings and proxies alike, docs/readings/asap.md#asap-r31):

  spread ratio    the proxies' collapse: per class, the mean distance between two of its proxies over
                  the mean distance between two of its test embeddings, averaged over classes
                  (0: the class's proxies sit at one point, Fig. 1 (a); about 1: spread like its samples)
  proxy radius    the covering radius δ of Prop. 4.2 (its proof: "the maximum distance between the
                  corresponding class samples and the class proxy"): per class, the largest distance
                  from a test embedding to its nearest class proxy, averaged over classes
  radius per projection   App. A.3.1's average covering radius (report's Fig. 7, ASAP-R23) of the
                  validation embeddings at each projection's solution θ* (projections/projection-K_val.npz:
                  K = 0 is single proxy-based training, K ≥ 1 follows alternation K)

from the run folder's embeddings_test.npz, final_proxies.npz (the loss's proxies when training ended)
and projections/ (asap.save_val_embeddings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.spatial.distance import pdist

from dmlrepro.train.state import RunDir


def _normalize(x: np.ndarray, mode: str) -> np.ndarray:
    # torch (dmlrepro.asap): deferred, so that dmlrepro.report imports without it
    from dmlrepro.asap.normalisation import normalize_array

    return normalize_array(np.asarray(x, dtype=np.float32), mode).astype(np.float64)


def mean_pairwise_distance(points: np.ndarray) -> float | None:
    """The mean Euclidean distance over the pairs of distinct rows of `points` (None: fewer than 2)."""
    points = np.asarray(points, dtype=np.float64)
    return float(pdist(points).mean()) if len(points) >= 2 else None


def spread_ratio(
    embeddings: np.ndarray, labels: np.ndarray, proxies: np.ndarray, proxy_labels: np.ndarray
) -> float | None:
    """Mean over the classes with ≥ 2 proxies and ≥ 2 embeddings of (mean distance between two of the
    class's proxies) / (mean distance between two of its embeddings); None when no class has both."""
    labels, proxy_labels = np.asarray(labels), np.asarray(proxy_labels)
    ratios = []
    for c in np.unique(proxy_labels):
        own = mean_pairwise_distance(proxies[proxy_labels == c])
        scale = mean_pairwise_distance(embeddings[labels == c])
        if own is not None and scale:
            ratios.append(own / scale)
    return float(np.mean(ratios)) if ratios else None


def proxy_covering_radius(
    embeddings: np.ndarray, labels: np.ndarray, proxies: np.ndarray, proxy_labels: np.ndarray
) -> float | None:
    """δ of Prop. 4.2: per class, max over its embeddings of the distance to the nearest class proxy,
    averaged over the classes that have both (None: none has)."""
    labels, proxy_labels = np.asarray(labels), np.asarray(proxy_labels)
    radii = []
    for c in np.unique(proxy_labels):
        points = embeddings[labels == c]
        if len(points):
            d = np.linalg.norm(points[:, None, :] - proxies[proxy_labels == c][None, :, :], axis=-1)
            radii.append(float(d.min(axis=1).max()))
    return float(np.mean(radii)) if radii else None


def run_geometry(run: Mapping) -> dict:
    """One run's measures (module docstring) and what its figures draw: `test` (embeddings, labels),
    `proxies`, `proxy_labels` and `projections` [(K, embeddings, labels)], all in the measured space."""
    # torch (dmlrepro.evaluation): deferred, so that dmlrepro.report imports without it
    from dmlrepro.evaluation.embeddings_io import load_embeddings
    from dmlrepro.evaluation.geometry import average_covering_radius

    rundir, mode = RunDir(run["dir"]), run["config"]["eval"].get("normalize", "none")
    if not rundir.final_proxies.is_file():
        raise ValueError(
            f"report kind proxy_geometry: run {run['run_id']} has no {RunDir.FINAL_PROXIES} "
            f"(a loss without proxies, or the run has not finished)"
        )
    saved = rundir.saved_projections()
    if not saved:
        raise ValueError(
            f"report kind proxy_geometry: run {run['run_id']} saved no validation embeddings "
            f"(set asap.save_val_embeddings: true)"
        )
    test = load_embeddings(rundir.embeddings())
    with np.load(rundir.final_proxies) as found:
        proxies, proxy_labels = _normalize(found["proxies"], mode), found["labels"]
    embeddings = _normalize(test.embeddings, mode)
    projections, radii = [], []
    for path in saved:
        val = load_embeddings(path)
        points = _normalize(val.embeddings, mode)
        projections.append((int(val.meta["projection"]), points, val.labels))
        radii.append(average_covering_radius(points, val.labels))
    return {
        "run_id": run["run_id"],
        "method": run["method"],
        "seed": run["seed"],
        "normalize": mode,
        "spread_ratio": spread_ratio(embeddings, test.labels, proxies, proxy_labels),
        "proxy_radius": proxy_covering_radius(embeddings, test.labels, proxies, proxy_labels),
        "projections": [k for k, _, _ in projections],
        "radius": radii,
        "radius_shrinks": radii[-1] < radii[0] if len(radii) > 1 else None,
        "drawn": {
            "test": (embeddings, test.labels),
            "proxies": proxies,
            "proxy_labels": proxy_labels,
            "projections": projections,
        },
    }


def _mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    return (float(x.mean()) if len(x) else None, float(x.std(ddof=1)) if len(x) > 1 else None, len(x))


def method_summary(rows: Sequence[Mapping], methods: Mapping[str, str]) -> list[dict]:
    """Per method (declared order of the rows): mean ± std over its runs of the spread ratio, the proxy
    radius, the average covering radius at the first and at the last projection, and in how many of
    its runs with several projections the radius shrank."""
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        alternating = [r for r in mine if r["radius_shrinks"] is not None]
        entry = {
            "method": method,
            "label": methods.get(method, method),
            "runs": len(mine),
            "projections": [len(r["radius"]) for r in mine],
            "shrinks": sum(bool(r["radius_shrinks"]) for r in alternating),
            "alternating": len(alternating),
        }
        for key, values in (
            ("spread_ratio", [r["spread_ratio"] for r in mine]),
            ("proxy_radius", [r["proxy_radius"] for r in mine]),
            ("radius_first", [r["radius"][0] for r in mine]),
            ("radius_last", [r["radius"][-1] for r in mine]),
        ):
            entry[key], entry[f"{key}_std"], entry[f"{key}_n"] = _mean_std(values)
        out.append(entry)
    return out


# -- what the section's figures draw (report.figures.embedding_2d_figure, projection_radius_figure)


def final_panel(measured: Mapping, label: str) -> dict:
    """A run's test embeddings with its final proxies, titled with its spread ratio and δ."""
    embeddings, labels = measured["drawn"]["test"]
    return {
        "title": f"{label} (seed {measured['seed']})\nproxy spread ratio {_text(measured['spread_ratio'])}, "
        f"δ {_text(measured['proxy_radius'])}",
        "embeddings": embeddings,
        "labels": labels,
        "proxies": measured["drawn"]["proxies"],
        "proxy_labels": measured["drawn"]["proxy_labels"],
    }


def projection_panels_2d(measured: Mapping) -> list[dict]:
    """A run's validation embeddings at each projection's solution, titled with its covering radius."""
    return [
        {
            "title": ("single proxy-DML" if k == 0 else f"after alternation {k}") + f": radius {radius:.3f}",
            "embeddings": points,
            "labels": labels,
            "proxies": np.empty((0, 2)),
            "proxy_labels": np.empty(0),
        }
        for (k, points, labels), radius in zip(measured["drawn"]["projections"], measured["radius"])
    ]


def radius_curve(measured: Mapping, label: str) -> dict:
    return {
        "label": f"{label}, seed {measured['seed']}",
        "projection": measured["projections"],
        "radius": measured["radius"],
    }


def _text(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
