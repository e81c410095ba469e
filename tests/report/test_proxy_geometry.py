"""ASAP Fig. 1's mechanism measured (report kind proxy_geometry, report.proxy_geometry): the proxies'
collapse (spread ratio), Prop. 4.2's covering radius δ by the proxies and App. A.3.1's average
covering radius per projection, on fabricated run folders whose values are worked out by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dmlrepro.evaluation.embeddings_io import save_embeddings
from dmlrepro.report import provenance, render_report
from dmlrepro.report.aggregate import aggregate_runs
from dmlrepro.report.proxy_geometry import (
    mean_pairwise_distance,
    method_summary,
    proxy_covering_radius,
    run_geometry,
    spread_ratio,
)
from dmlrepro.report.sections import build_section
from dmlrepro.train.state import RunDir

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"

# two classes of test embeddings: class 0 at a 3-4-5 triangle (mean pairwise distance (3 + 4 + 5) / 3 = 4),
# class 1 at two points 4 apart
TEST = np.array([[0, 0], [3, 0], [0, 4], [10, 0], [10, 4]], dtype=np.float32)
TEST_LABELS = np.array([0, 0, 0, 1, 1])
# C2-Proxy's final proxies (Fig. 1 (a)): both of class 0 at one point; C2-ASAP's: spread
COLLAPSED = np.array([[0, 0], [0, 0], [10, 1], [10, 1]], dtype=np.float32)
SPREAD = np.array([[0, 0], [0, 4], [10, 0], [10, 4]], dtype=np.float32)
PROXY_LABELS = np.array([0, 0, 1, 1])


def test_mean_pairwise_distance():
    assert mean_pairwise_distance(np.array([[0, 0], [3, 0], [0, 4]])) == pytest.approx(4.0)  # (3 + 4 + 5) / 3
    assert mean_pairwise_distance(np.array([[1.0, 2.0]])) is None


def test_collapsed_proxies_have_spread_ratio_zero_and_a_large_radius():
    # collapsed: every class's proxies at one point -> 0; spread: class 0 4/4 = 1 (proxies 4 apart,
    # samples 4 on average), class 1 4/4 = 1
    assert spread_ratio(TEST, TEST_LABELS, COLLAPSED, PROXY_LABELS) == pytest.approx(0.0)
    assert spread_ratio(TEST, TEST_LABELS, SPREAD, PROXY_LABELS) == pytest.approx(1.0)
    # δ: class 0 by (0, 0): its farthest sample (0, 4) at 4; class 1 by (10, 1): (10, 4) at 3 -> (4 + 3) / 2
    assert proxy_covering_radius(TEST, TEST_LABELS, COLLAPSED, PROXY_LABELS) == pytest.approx(3.5)
    # spread: class 0 by (0, 0), (0, 4): (3, 0) at 3; class 1 sits on its proxies (0) -> 1.5
    assert proxy_covering_radius(TEST, TEST_LABELS, SPREAD, PROXY_LABELS) == pytest.approx(1.5)


def test_a_class_with_one_proxy_has_no_spread():
    assert spread_ratio(TEST, TEST_LABELS, SPREAD[:1], PROXY_LABELS[:1]) is None


def _run(tmp_path, name, method, seed, proxies, projections, normalize="none"):
    """A run folder as the engine leaves it: embeddings_test.npz, final_proxies.npz and, per projection
    K, projections/projection-K_val.npz (asap.save_val_embeddings)."""
    rundir = RunDir(tmp_path / name)
    rundir.root.mkdir(parents=True)
    save_embeddings(rundir.embeddings(), TEST, TEST_LABELS)
    np.savez(rundir.final_proxies, proxies=proxies, labels=PROXY_LABELS)
    rundir.val_embeddings.mkdir()
    for k, points in enumerate(projections):
        save_embeddings(
            rundir.projection_embeddings(k), points, [0, 0, 1, 1], split="validation", meta={"projection": k}
        )
    return {
        "run_id": name,
        "method": method,
        "dataset": "mnist",
        "seed": seed,
        "dir": str(rundir.root),
        "config": {"eval": {"normalize": normalize}},
    }


# validation embeddings, two samples per class: App. A.3.1's radius of two points d apart is the mean of
# r_1 = d (one centre) and r_2 = 0, i.e. d / 2; projection 0: d = 2 and 1 -> (1 + 0.5) / 2 = 0.75;
# after alternation 1: d = 1 and 0.5 -> 0.375
STAGE_A = np.array([[0, 0], [2, 0], [5, 5], [5, 6]], dtype=np.float32)
STAGE_B = np.array([[0, 0], [1, 0], [5, 5], [5, 5.5]], dtype=np.float32)


def test_run_geometry_reads_the_run_folder(tmp_path):
    measured = run_geometry(_run(tmp_path, "asap", "c2_asap_mnist", 0, SPREAD, [STAGE_A, STAGE_B]))
    assert measured["spread_ratio"] == pytest.approx(1.0) and measured["proxy_radius"] == pytest.approx(1.5)
    assert measured["projections"] == [0, 1]
    assert measured["radius"] == pytest.approx([0.75, 0.375])
    assert measured["radius_shrinks"] is True
    single = run_geometry(_run(tmp_path, "proxy", "c2_proxy_mnist", 0, COLLAPSED, [STAGE_A]))
    assert single["radius"] == pytest.approx([0.75]) and single["radius_shrinks"] is None


def test_measured_in_the_evaluated_space(tmp_path):
    """eval.normalize: lipschitz (ASAP Sec. 4.4) maps v to v / max(1, ‖v‖) before measuring: the spread
    proxies of class 1 at (10, 0) and (10, 4) land at (1, 0) and (10, 4) / √116."""
    measured = run_geometry(_run(tmp_path, "asap", "c2_asap_mnist", 0, SPREAD, [STAGE_A * 0.1], "lipschitz"))
    assert measured["radius"] == pytest.approx([0.075])  # every point inside the unit disk: unchanged
    n = np.sqrt(116.0)
    class1 = math.dist((1.0, 0.0), (10 / n, 4 / n))  # the proxies' and the samples' distance alike
    class0 = mean_pairwise_distance(np.array([[0, 0], [1, 0], [0, 1]]))  # (1 + 1 + √2) / 3
    assert measured["spread_ratio"] == pytest.approx((1.0 / class0 + class1 / class1) / 2)


def test_method_summary_over_seeds(tmp_path):
    projections = {0: [STAGE_A * 0.5], 1: [STAGE_A, STAGE_B]}
    rows = [run_geometry(_run(tmp_path, f"asap{s}", "c2_asap_mnist", s, SPREAD, projections[s])) for s in (0, 1)]
    rows += [run_geometry(_run(tmp_path, "proxy0", "c2_proxy_mnist", 0, COLLAPSED, [STAGE_A]))]
    asap, proxy = method_summary(rows, {"c2_asap_mnist": "C2-ASAP"})
    assert asap["label"] == "C2-ASAP" and asap["runs"] == 2 and asap["projections"] == [1, 2]
    # seed 0 has one projection (0.375 = 0.75 / 2: STAGE_A halved) and seed 1 two (0.75 -> 0.375)
    assert asap["alternating"] == 1 and asap["shrinks"] == 1
    assert asap["radius_first"] == pytest.approx((0.375 + 0.75) / 2) and asap["radius_last"] == pytest.approx(0.375)
    assert asap["radius_last_std"] == pytest.approx(0.0)
    assert proxy["label"] == "c2_proxy_mnist" and proxy["spread_ratio"] == pytest.approx(0.0)
    assert proxy["spread_ratio_std"] is None and proxy["alternating"] == 0


def test_missing_outputs_are_named(tmp_path):
    run = _run(tmp_path, "asap", "c2_asap_mnist", 0, SPREAD, [])
    with pytest.raises(ValueError, match="saved no validation embeddings .*asap.save_val_embeddings: true"):
        run_geometry(run)
    RunDir(run["dir"]).final_proxies.unlink()
    with pytest.raises(ValueError, match="run asap has no final_proxies.npz"):
        run_geometry(run)


def test_the_section_tables_and_draws_the_mechanism(tmp_path):
    """real_data.yaml's real_mnist_poc on fabricated runs: section.json holds the per-method summary and
    every run's measures, the three kinds of figure are drawn, and index.html shows the table."""
    import yaml

    experiment = yaml.safe_load((ROOT / "config" / "real_data.yaml").read_text())["experiments"]["real_mnist_poc"]
    assert experiment["report"]["kind"] == "proxy_geometry"
    runs = [
        _run(tmp_path / "runs", "proxy-s0", "c2_proxy_mnist", 0, COLLAPSED, [STAGE_A], "lipschitz"),
        _run(tmp_path / "runs", "asap-s0", "c2_asap_mnist", 0, SPREAD, [STAGE_A, STAGE_B], "lipschitz"),
    ]
    out = tmp_path / "section"
    section = build_section(
        "real_mnist_poc",
        experiment,
        aggregate_runs([], []),
        runs,
        out,
        reported_dir=ROOT / "config" / "reported",
        method_configs={},
    )
    assert [g["label"] for g in section["proxy_geometry"]] == ["C2-Proxy (single proxy-DML)", "C2-ASAP"]
    assert json.loads((out / "section.json").read_text())["proxy_geometry_runs"][1]["radius_shrinks"] is True
    files = [f["file"] for f in section["figures"]]
    assert files == [
        "real_mnist_poc_proxies.png",
        "real_mnist_poc_c2_proxy_mnist_projections.png",
        "real_mnist_poc_c2_asap_mnist_projections.png",
        "real_mnist_poc_radius.png",
    ]
    assert all((out / f).read_bytes().startswith(PNG) for f in files)
    html = tmp_path / "report" / "index.html"
    render_report([section], [out], provenance(ROOT, [], {}), html, ROOT / "reports" / "templates")
    text = html.read_text()
    assert "proxy spread ratio (0: collapsed)" in text and "1 of 1 runs" in text and "– (one projection)" in text
    assert "class proxies collapse to a single point" in text  # the paper's words beside the figure


@pytest.fixture(scope="module")
def trained_pair(tmp_path_factory):
    """The embedded default's 2-d C2-ASAP run (asap_poc_2d, digits) cut to 4 epochs with a projection
    patience of 1, and its Loss-Proxy twin (one projection, λ = 0): what the engine writes."""
    import yaml

    from dmlrepro.runs import resolve_runs
    from dmlrepro.train import train_run

    (run,) = resolve_runs(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), ["asap_poc_2d"]).values()
    root = tmp_path_factory.mktemp("e2e")
    base = {
        **run.config,
        "epochs": 4,
        "threads": 1,
        "dataset": {**run.config["dataset"], "root": str(root / "data")},
        "asap": {**run.config["asap"], "projection_patience": 1},
    }
    out = []
    for method, asap in (("c2_proxy_2d", {"lam": 0.0, "alternate": False}), ("c2_asap_2d", {})):
        config = {**base, "asap": {**base["asap"], **asap}}
        assert train_run(config, root / method, progress=False)["status"] == "completed"
        out.append(
            {
                "run_id": method,
                "method": method,
                "dataset": "digits",
                "seed": 0,
                "config": config,
                "dir": str(root / method),
            }
        )
    return out


@pytest.mark.slow
def test_the_section_reads_what_the_engine_writes(trained_pair, tmp_path):
    experiment = {
        "methods": ["c2_proxy_2d", "c2_asap_2d"],
        "datasets": ["digits"],
        "metrics": ["map@r"],
        "report": {"kind": "proxy_geometry"},
    }
    section = build_section(
        "poc",
        experiment,
        aggregate_runs([], []),
        trained_pair,
        tmp_path,
        reported_dir=ROOT / "config" / "reported",
        method_configs={},
    )
    single, asap = section["proxy_geometry_runs"]
    alternations = json.loads((Path(trained_pair[1]["dir"]) / "metrics.json").read_text())["validation"]["alternations"]
    assert single["projections"] == [0] and asap["projections"] == list(range(alternations + 1))
    assert all(r["spread_ratio"] is not None and r["proxy_radius"] > 0 for r in (single, asap))
    assert all((tmp_path / f["file"]).read_bytes().startswith(PNG) for f in section["figures"])
