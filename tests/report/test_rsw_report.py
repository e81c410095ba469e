"""RSW report kinds (curves, heatmap, landscape, embedding_2d), block-as-metric tables and the
last-finite aggregation, each against an independent computation."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from dmlrepro.losses import RSWLoss
from dmlrepro.report import aggregate_runs, figures
from dmlrepro.report.landscapes import rsw_landscape
from dmlrepro.report.section_data import blocks_as_metrics, run_curves
from dmlrepro.report.sections import build_section

PNG = b"\x89PNG\r\n\x1a\n"
REPORTED = "config/reported"

# RSW Table III, the printed f1(t1) − f2(t2) of each row
PRINTED = {
    "V1": lambda t1, t2: t1 - t2,
    "V2": lambda t1, t2: t1**2 - t2**2,
    "V3": lambda t1, t2: math.sqrt(t1) - math.sqrt(t2),
    "V4": lambda t1, t2: t1**1.5 - t2**1.5,
    "V5": lambda t1, t2: 0.97 * t1 - t2,
    "V6": lambda t1, t2: 0.5 * t1 - t2,
    "V7": lambda t1, t2: 1.1 * t1 - t2,
    "V8": lambda t1, t2: 2.0 * t1 - t2,
}


def _eq7(t, k1, k2, alpha, mode):
    """Eq. 7 written out for one t: Δ read as its value, as the continuous (1 − k1)·α, or left out."""
    if t < alpha:
        delta = {"value": (1 - k1) * t, "continuous": (1 - k1) * alpha, "none": 0.0}[mode]
        return k1 * t + delta
    return k2 * t + (1 - k2) * alpha


def _points():
    return np.random.default_rng(0).uniform(-5, 5, (40, 2))


@pytest.mark.parametrize("name", sorted(PRINTED))
def test_landscape_equals_the_printed_table3_functions(name):
    from dmlrepro.losses.rsw import RSW_FUNCTIONS

    proxies = np.array([[0.0, 0.0], [2.0, 0.0]])
    got = rsw_landscape(_points(), proxies, RSW_FUNCTIONS[name], scale=1.0)
    for value, e in zip(got, _points()):
        t1, t2 = math.dist(e, proxies[0]), math.dist(e, proxies[1])
        assert value == pytest.approx(math.log1p(math.exp(PRINTED[name](t1, t2))), rel=1e-12)


@pytest.mark.parametrize("mode", ["value", "continuous", "none"])
def test_landscape_of_the_eq7_warp_with_each_delta_reading(mode):
    hp = {"alpha": 3.0, "k1": 0.65, "k2": 1.5}
    proxies = np.array([[0.0, 0.0], [2.0, 0.0], [-1.5, 2.5]])
    got = rsw_landscape(_points(), proxies, hp, scale=2.0, delta=mode)
    for value, e in zip(got, _points()):
        t = [math.dist(e, p) for p in proxies]
        f1 = _eq7(t[0], 0.65, 1.5, 3.0, mode)
        assert value == pytest.approx(math.log1p(sum(math.exp(2.0 * (f1 - tj)) for tj in t[1:])), rel=1e-12)


def test_landscape_value_reading_equals_the_loss_module_per_sample():
    """The "value" reading is what RSWLoss computes in its forward pass (Δ's value, stop-gradient aside)."""
    loss = RSWLoss(4, 2, alpha=3.0, k1=0.65, k2=1.5, scale=1.7, delta_scale=1.3).double()
    proxies = np.array([[0.0, 0.0], [2.5, 0.0], [-1.5, 2.5], [-1.0, -2.5]])
    with torch.no_grad():
        loss.proxies.copy_(torch.tensor(proxies))
        e = torch.tensor(_points())
        y = torch.zeros(len(e), dtype=torch.long)
        expected = F.cross_entropy(-loss.scale * loss.warped_distances(e, y), y, reduction="none").numpy()
    got = rsw_landscape(_points(), proxies, {"alpha": 3.0, "k1": 0.65, "k2": 1.5, "delta_scale": 1.3}, scale=1.7)
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_heatmap_grid_places_each_sweep_point():
    rows = [
        {
            "method": "rsw",
            "dataset": "synthetic",
            "sweep": f"loss.hparams.k1={k1}, loss.hparams.k2={k2}",
            "recall@1_mean": k1 * 10 + k2,
            "recall@1_std": np.nan,
            "seeds": 1,
            "diverged": 0,
        }
        for k1 in (0.5, 1.0)
        for k2 in (1.0, 1.5, 2.0)
        if not (k1 == 1.0 and k2 == 2.0)
    ]
    xs, ys, grid = figures.heatmap_grid(pd.DataFrame(rows), "loss.hparams.k1", "loss.hparams.k2", "recall@1")
    assert xs == [0.5, 1.0] and ys == [1.0, 1.5, 2.0]
    for i, k2 in enumerate(ys):
        for j, k1 in enumerate(xs):
            expected = np.nan if (k1, k2) == (1.0, 2.0) else 100 * (k1 * 10 + k2)
            np.testing.assert_equal(grid[i, j], expected)


def _write_log(folder, values, diverged=False):
    folder.mkdir(parents=True)
    rows = [
        {
            "epoch": e,
            "phase": 1,
            "steps": 0 if e == 0 else 5,
            "loss": "" if e == 0 else 1.0,
            "seconds": 0.1,
            "test_recall@1": 0.1,
            "avg_dtp": v,
        }
        for e, v in enumerate(values)
    ]
    if diverged:
        rows.append(
            {
                "epoch": len(values),
                "phase": 1,
                "steps": 2,
                "loss": float("nan"),
                "seconds": 0.1,
                "test_recall@1": "",
                "avg_dtp": "",
            }
        )
    pd.DataFrame(rows).to_csv(folder / "train_log.csv", index=False)


def test_run_curves_average_seeds_per_epoch_and_mark_divergence(tmp_path):
    _write_log(tmp_path / "a0", [3.0, 2.0, 1.0])
    _write_log(tmp_path / "a1", [5.0, 4.0, 3.0])
    _write_log(tmp_path / "b0", [3.0, 9.0], diverged=True)
    runs = [
        {"run_id": n, "method": m, "dataset": "synthetic", "seed": s, "dir": str(tmp_path / n), "sweep": {}}
        for n, m, s in (("a0", "rsw_v1", 0), ("a1", "rsw_v1", 1), ("b0", "rsw_v5", 0))
    ]
    curves = {c["label"]: c for c in run_curves(runs, "avg_dtp", {"rsw_v1": "V1"})}
    assert list(curves) == ["V1", "rsw_v5"]
    np.testing.assert_array_equal(curves["V1"]["epoch"], [0, 1, 2])
    np.testing.assert_allclose(curves["V1"]["value"], [4.0, 3.0, 2.0])
    assert not curves["V1"]["diverged"] and curves["rsw_v5"]["diverged"]
    np.testing.assert_allclose(curves["rsw_v5"]["value"], [3.0, 9.0])
    with pytest.raises(ValueError, match="proxy_metrics_per_epoch"):
        run_curves(runs, "w2", {})


def test_aggregate_keeps_a_diverged_runs_last_finite_result_only_when_asked():
    records = [
        {
            "method": "rsw_v5",
            "dataset": "synthetic",
            "sweep": {},
            "seed": 0,
            "result": {"status": "diverged", "metrics": {"recall@1": 0.25}, "proxy_metrics": {"avg_dtp": 7.0}},
        },
        {
            "method": "rsw_v1",
            "dataset": "synthetic",
            "sweep": {},
            "seed": 0,
            "result": {
                "status": "completed",
                "metrics": {"recall@1": 0.5},
                "corruption_metrics": {"recall@1@gaussian_3": 0.125},
            },
        },
    ]
    hidden = aggregate_runs(records, ["recall@1", "avg_dtp"])
    assert hidden["recall@1_mean"].isna().tolist() == [True, False]
    shown = aggregate_runs(records, ["recall@1", "avg_dtp", "recall@1@gaussian_3"], last_finite=True)
    assert shown["recall@1_mean"].tolist() == [0.25, 0.5] and shown["avg_dtp_mean"].iloc[0] == 7.0
    assert shown["recall@1@gaussian_3_mean"].iloc[1] == 0.125 and shown["diverged"].tolist() == [1, 0]


def test_table4_blocks_become_corruption_metrics():
    from dmlrepro.report.reported import load_reported

    reported = load_reported(f"{REPORTED}/rsw_table4.csv")
    frame = blocks_as_metrics(
        reported, {"recall@1": "Uncorrupted", "recall@1@gaussian_3": "Additive Noise: Gaussian"}, ["CUB-200-2011"]
    )
    got = {(r.method, r.dataset, r.metric): r.value for r in frame.itertuples()}
    assert got[("Warped Softmax", "CUB-200-2011", "recall@1")] == 72.5  # RSW Table IV
    assert got[("Regular Softmax", "CUB-200-2011", "recall@1@gaussian_3")] == 56.7
    assert got[("HIST", "CUB-200-2011", "recall@1@gaussian_3")] == 57.2
    assert len(frame) == 8
    with pytest.raises(ValueError, match="no reported rows"):
        blocks_as_metrics(reported, {"recall@1": "Blur"}, [])


def test_sections_of_the_new_kinds_write_pngs(tmp_path):
    # landscape: no runs
    methods = {
        "v2": {"loss": {"name": "rsw", "hparams": {"function": "power", "power": 2.0}}},
        "w": {"loss": {"name": "rsw", "hparams": {"alpha": 3.0, "k1": 0.65, "k2": 1.5}}},
    }
    empty = aggregate_runs([], [])
    section = build_section(
        "land",
        {"methods": ["v2", "w"], "datasets": [], "metrics": [], "report": {"kind": "landscape", "delta": "continuous"}},
        empty,
        [],
        tmp_path / "land",
        reported_dir=REPORTED,
        method_configs=methods,
    )
    assert (tmp_path / "land" / section["figures"][0]["file"]).read_bytes()[:8] == PNG
    # heatmap + table
    rows = [
        {
            "method": "rsw",
            "dataset": "synthetic",
            "sweep": f"loss.hparams.k1={a}, loss.hparams.k2={b}",
            "seed": 0,
            "result": {"status": "completed", "metrics": {"recall@1": a * b / 3}},
        }
        for a in (0.5, 1.0)
        for b in (1.0, 1.5)
    ]
    for r in rows:
        r["sweep"] = dict(part.split("=") for part in r["sweep"].split(", "))
        r["sweep"] = {k: float(v) for k, v in r["sweep"].items()}
    table = aggregate_runs(rows, ["recall@1"])
    section = build_section(
        "heat",
        {
            "methods": ["rsw"],
            "datasets": ["synthetic"],
            "metrics": ["recall@1"],
            "report": {"kind": "heatmap", "x": "loss.hparams.k1", "y": "loss.hparams.k2"},
        },
        table,
        [],
        tmp_path / "heat",
        reported_dir=REPORTED,
        method_configs={},
    )
    assert section["table"]["rows"] and (tmp_path / "heat" / section["figures"][0]["file"]).read_bytes()[:8] == PNG
    assert json.loads((tmp_path / "heat" / "section.json").read_text())["kind"] == "heatmap"


def test_embedding_2d_figure_refuses_embeddings_that_are_not_2d(tmp_path):
    panel = {
        "title": "x",
        "embeddings": np.zeros((4, 3)),
        "labels": np.zeros(4, int),
        "proxies": np.zeros((1, 3)),
        "proxy_labels": np.zeros(1, int),
    }
    with pytest.raises(ValueError, match="embedding_size: 2"):
        figures.embedding_2d_figure([panel], tmp_path / "e.png")
    panel.update(
        embeddings=np.random.default_rng(0).normal(size=(20, 2)),
        labels=np.arange(20) % 2,
        proxies=np.zeros((2, 2)),
        proxy_labels=np.array([0, 1]),
    )
    figures.embedding_2d_figure([panel], tmp_path / "e.png")
    assert (tmp_path / "e.png").read_bytes()[:8] == PNG


def test_published_only_table_keeps_the_printed_column_order_and_claims_no_stand_in():
    from dmlrepro.report.compare import comparison_table
    from dmlrepro.report.reported import load_reported

    reported = load_reported(f"{REPORTED}/rsw_table5.csv")
    names = {"LFW": "LFW", "CFP-FP": "CFP-FP", "AgeDB-30": "AgeDB-30", "CALFW": "CALFW", "CPLFW": "CPLFW"}
    sorted_names = dict(sorted(names.items()))  # Snakemake hands the mapping over with sorted keys
    table = comparison_table(aggregate_runs([], ["accuracy"]), reported, ["accuracy"], {}, sorted_names, 1)
    assert [c["dataset"] for c in table["columns"]] == ["LFW", "CFP-FP", "AgeDB-30", "CALFW", "CPLFW"]
    assert not any(c["stand_in"] for c in table["columns"])
    warped = next(r for r in table["rows"] if r["label"] == "Warped-Softmax")
    assert [c["paper"] for c in warped["cells"]] == [99.85, 98.66, 97.63, 95.82, 93.25]  # RSW Table V
