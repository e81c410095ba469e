"""MLRC aggregation (report.aggregate.mlrc_records, evaluation.mlrc.fold_ensemble_metrics) and the
Fig. 7 geometry measures (evaluation.geometry), against direct float64 computations."""

import itertools
import json

import numpy as np
import pytest

from dmlrepro.evaluation import save_embeddings
from dmlrepro.evaluation.geometry import average_covering_radius, greedy_covering_radii, mean_interclass_distance
from dmlrepro.report.aggregate import aggregate_runs, mlrc_records


def _map_at_r(emb, labels):
    """Leave-one-out MAP@R, P@1 and R-precision by a plain loop on Euclidean distances (float64)."""
    emb = np.asarray(emb, dtype=np.float64)
    d = np.linalg.norm(emb[:, None] - emb[None], axis=-1)
    maps, p1, rp = [], [], []
    for q in range(len(emb)):
        others = [i for i in range(len(emb)) if i != q]
        order = sorted(others, key=lambda i: (d[q, i], i))
        r = sum(labels[i] == labels[q] for i in others)
        hits = [labels[i] == labels[q] for i in order[:r]]
        maps.append(sum(sum(hits[: k + 1]) / (k + 1) for k in range(r) if hits[k]) / r)
        p1.append(float(hits[0]))
        rp.append(sum(hits) / r)
    return {"map@r": np.mean(maps), "precision@1": np.mean(p1), "r_precision": np.mean(rp)}


def _fold_runs(tmp_path, folds=4, seed=0, diverged=()):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(5), 4)
    rows, records, embs = np.arange(20) + 100, [], []
    for fold in range(folds):
        folder = tmp_path / f"run{seed}_{fold}"
        folder.mkdir()
        emb = rng.normal(size=(20, 3)) + labels[:, None] * rng.normal(size=3) * 0.5
        embs.append(emb)
        save_embeddings(folder / "embeddings_test.npz", emb.astype(np.float32), labels, rows)
        status = "diverged" if fold in diverged else "completed"
        result = {"status": status, "ks": [1], "metrics": {"map@r": 0.1 * (fold + 1), "precision@1": 0.5}}
        records.append(
            {
                "run_id": folder.name,
                "method": "m",
                "dataset": "d",
                "seed": seed,
                "dir": str(folder),
                "sweep": {"validation.fold": fold},
                "result": result,
                "timing": {"train_hours": 1.0, "seconds_per_epoch": 2.0},
            }
        )
    return records, embs, labels


def test_concatenated_metrics_equal_a_direct_computation(tmp_path):
    records, embs, labels = _fold_runs(tmp_path)
    (out,) = mlrc_records(records)
    unit = [e / np.linalg.norm(e, axis=1, keepdims=True) for e in embs]
    joined = np.concatenate(unit, axis=1)
    joined /= np.linalg.norm(joined, axis=1, keepdims=True)
    direct = _map_at_r(joined, labels)
    for name, value in direct.items():
        assert out["result"]["metrics"][f"{name}@concatenated"] == pytest.approx(value, abs=1e-6)
    # the concatenation is not any single fold's result
    assert out["result"]["metrics"]["map@r@concatenated"] != pytest.approx(_map_at_r(unit[0], labels)["map@r"])


def test_concatenated_query_gallery_metrics_equal_a_direct_computation(tmp_path):
    """In-Shop: the fold models' query and gallery embeddings are concatenated separately, then the
    queries retrieve from the gallery (brute force: every gallery item is a candidate)."""
    from dmlrepro.evaluation.mlrc import fold_ensemble_metrics

    rng = np.random.default_rng(3)
    q_labels, g_labels = np.repeat(np.arange(4), 3), np.repeat(np.arange(4), 5)
    dirs, q_units, g_units = [], [], []
    for fold in range(3):
        folder = tmp_path / f"fold{fold}"
        folder.mkdir()
        centres = rng.normal(size=(4, 3))
        q = centres[q_labels] + rng.normal(size=(12, 3))
        g = centres[g_labels] + rng.normal(size=(20, 3))
        save_embeddings(folder / "embeddings_test.npz", q.astype(np.float32), q_labels, np.arange(12), split="query")
        save_embeddings(
            folder / "embeddings_gallery.npz", g.astype(np.float32), g_labels, np.arange(20), split="gallery"
        )
        dirs.append(folder)
        q_units.append(q / np.linalg.norm(q, axis=1, keepdims=True))
        g_units.append(g / np.linalg.norm(g, axis=1, keepdims=True))
    q = np.concatenate(q_units, axis=1)
    g = np.concatenate(g_units, axis=1)
    q, g = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (q, g))
    d = np.linalg.norm(q[:, None] - g[None], axis=-1)
    maps, p1 = [], []
    for i in range(len(q)):
        order = sorted(range(len(g)), key=lambda j: (d[i, j], j))
        r = int((g_labels == q_labels[i]).sum())
        hits = [g_labels[j] == q_labels[i] for j in order[:r]]
        maps.append(sum(sum(hits[: k + 1]) / (k + 1) for k in range(r) if hits[k]) / r)
        p1.append(float(hits[0]))
    got = fold_ensemble_metrics(
        [d / "embeddings_test.npz" for d in dirs], ks=(1,), gallery_files=[d / "embeddings_gallery.npz" for d in dirs]
    )
    assert got["map@r"] == pytest.approx(np.mean(maps), abs=1e-6)
    assert got["precision@1"] == pytest.approx(np.mean(p1), abs=1e-6)


def test_separated_is_the_fold_mean_and_the_group_is_one_record_per_seed(tmp_path):
    records = _fold_runs(tmp_path, seed=0)[0] + _fold_runs(tmp_path, seed=1)[0]
    out = mlrc_records(records)
    assert [(r["seed"], r["folds"], r["sweep"]) for r in out] == [(0, 4, {}), (1, 4, {})]
    assert out[0]["result"]["metrics"]["map@r@separated"] == pytest.approx(0.25)
    assert out[0]["timing"] == {"train_hours": 4.0, "seconds_per_epoch": 2.0}
    table = aggregate_runs(out, ["map@r@separated", "precision@1@concatenated"])
    assert table["seeds"].tolist() == [2] and table["map@r@separated_mean"].tolist() == pytest.approx([0.25])


def test_a_diverged_fold_makes_the_ensemble_diverged(tmp_path):
    records, _, _ = _fold_runs(tmp_path, diverged=(2,))
    (out,) = mlrc_records(records)
    assert {k: out["result"][k] for k in ("status", "metrics")} == {"status": "diverged", "metrics": {}}
    assert aggregate_runs([out], ["map@r@separated"])["diverged"].tolist() == [1]


def test_fold_runs_must_embed_the_same_items_and_carry_the_fold_key(tmp_path):
    records, embs, labels = _fold_runs(tmp_path)
    save_embeddings(tmp_path / "run0_3" / "embeddings_test.npz", embs[3].astype(np.float32), labels, np.arange(20))
    with pytest.raises(ValueError, match="other items"):
        mlrc_records(records)
    bad = [{**r, "sweep": {}} for r in records]
    with pytest.raises(ValueError, match="validation.fold"):
        mlrc_records(bad)


def test_greedy_covering_radii_follow_farthest_first_by_brute_force():
    rng = np.random.default_rng(3)
    pts = rng.normal(size=(7, 3))
    chosen, expected = [0], []
    for _ in range(7):
        radius = max(min(np.linalg.norm(p - pts[c]) for c in chosen) for p in pts)
        expected.append(radius)
        far = max(range(7), key=lambda i: (min(np.linalg.norm(pts[i] - pts[c]) for c in chosen), -i))
        chosen.append(far)
    assert greedy_covering_radii(pts) == pytest.approx(expected)
    assert greedy_covering_radii(pts)[-1] == 0.0
    labels = np.array([0, 0, 0, 1, 1, 1, 1])
    per_class = [np.mean(greedy_covering_radii(pts[labels == c])) for c in (0, 1)]
    assert average_covering_radius(pts, labels) == pytest.approx(np.mean(per_class))


def test_mean_interclass_distance_by_double_loop():
    rng = np.random.default_rng(4)
    pts, labels = rng.normal(size=(9, 2)), np.array([0, 0, 1, 1, 1, 2, 2, 0, 2])
    pairs = [
        np.linalg.norm(pts[i] - pts[j]) for i, j in itertools.product(range(9), repeat=2) if labels[i] != labels[j]
    ]
    assert mean_interclass_distance(pts, labels, chunk=4) == pytest.approx(np.mean(pairs))


def test_projection_sections_read_the_logs_and_saved_embeddings(tmp_path):
    from dmlrepro.report.sections import build_section

    run = tmp_path / "run"
    (run / "projections").mkdir(parents=True)
    log = {
        "steps_per_evaluation": 10,
        "projections": [
            {"projection": 0, "steps": 40, "end_reason": "alternation"},
            {"projection": 1, "steps": 60, "end_reason": "early_stop"},
        ],
    }
    (run / "validation_log.json").write_text(json.dumps(log))
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 8)
    for k in range(2):
        save_embeddings(
            run / "projections" / f"projection-{k}_val.npz",
            rng.normal(size=(32, 5)).astype(np.float32),
            labels,
            meta={"projection": k},
        )
    runs = [{"run_id": "r", "method": "c2_asap", "dataset": "synthetic", "seed": 0, "dir": str(run), "config": {}}]
    import pandas as pd

    steps = build_section(
        "f4b",
        {"methods": ["c2_asap"], "report": {"kind": "projection_steps"}},
        pd.DataFrame(),
        runs,
        tmp_path / "s1",
        reported_dir=tmp_path,
        method_configs={},
    )
    assert [p["steps"] for p in steps["projections"]] == [40, 60] and (tmp_path / "s1" / "f4b.png").is_file()
    geo = build_section(
        "f7",
        {"methods": ["c2_asap"], "report": {"kind": "projections"}},
        pd.DataFrame(),
        runs,
        tmp_path / "s2",
        reported_dir=tmp_path,
        method_configs={},
    )
    assert [g["projection"] for g in geo["geometry"]] == [0, 1]
    assert all(0 <= g["map@r"] <= 1 and g["covering_radius"] > 0 for g in geo["geometry"])


def test_ci95_over_reproductions_by_hand():
    """aggregate_runs' <metric>_ci95 = t(0.975, n-1) s / √n over seeds (t quantiles from a table, not scipy)."""
    t975 = {2: 12.7062, 3: 4.3027, 5: 2.7764}  # two-sided 95 % t quantiles for n - 1 = 1, 2, 4
    for n, t in t975.items():
        values = [0.2 + 0.01 * k * k for k in range(n)]
        records = [
            {
                "method": "m",
                "dataset": "d",
                "sweep": {},
                "seed": k,
                "result": {"status": "completed", "metrics": {"map@r@separated": v}},
            }
            for k, v in enumerate(values)
        ]
        row = aggregate_runs(records, ["map@r@separated"]).iloc[0]
        mean = sum(values) / n
        s = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
        assert row["map@r@separated_ci95"] == pytest.approx(t * s / n**0.5, rel=1e-4), n
    one = aggregate_runs(records[:1], ["map@r@separated"]).iloc[0]
    assert np.isnan(one["map@r@separated_ci95"])


def _complete(seed, status="completed", value=0.7):
    return {
        "run_id": f"complete{seed}",
        "method": "m",
        "dataset": "d",
        "seed": seed,
        "sweep": {"complete": True},
        "result": {"status": status, "metrics": {"map@r": value, "precision@1": 0.9}},
    }


def test_a_complete_run_joins_its_seeds_fold_group_as_the_complete_block(tmp_path):
    records = (
        _fold_runs(tmp_path, seed=0)[0] + _fold_runs(tmp_path, seed=1)[0] + [_complete(1, value=0.6), _complete(0)]
    )
    out = mlrc_records(records)
    assert [r["seed"] for r in out] == [0, 1]
    assert [r["result"]["metrics"]["map@r@complete"] for r in out] == [0.7, 0.6]
    assert out[0]["result"]["metrics"]["map@r@separated"] == pytest.approx(0.25)  # the folds' blocks stay
    table = aggregate_runs(out, ["map@r@complete"])
    assert table["map@r@complete_mean"].tolist() == pytest.approx([0.65])


def test_a_diverged_complete_run_makes_its_record_diverged_and_one_without_folds_is_an_error(tmp_path):
    records = _fold_runs(tmp_path)[0]
    (out,) = mlrc_records(records + [_complete(0, status="diverged")])
    assert out["result"]["status"] == "diverged"
    with pytest.raises(ValueError, match="Complete run .* has no fold runs"):
        mlrc_records(records + [_complete(5)])


def test_a_final_stage_table_expects_its_final_seeds(tmp_path):
    """A search experiment's table counts its final stage's reproductions (final.seeds), not the
    experiment's own seeds (RSW App. D: 10 reproductions of the best point)."""
    import pandas as pd

    from dmlrepro.report.sections import build_section

    aggregated = pd.DataFrame(
        [
            {
                "method": "rsw",
                "dataset": "synthetic",
                "sweep": "",
                "map@r@separated_mean": 0.3,
                "map@r@separated_std": 0.01,
                "map@r@separated_ci95": 0.02,
                "seeds": 2,
                "diverged": 0,
            }
        ]
    )
    experiment = {
        "methods": ["rsw"],
        "datasets": ["synthetic"],
        "metrics": ["map@r@separated"],
        "search": {"space": {}},
        "final": {"seeds": [0, 1]},
        "report": {"mlrc": True},
    }
    section = build_section("reality", experiment, aggregated, [], tmp_path, reported_dir=tmp_path, method_configs={})
    assert section["table"]["rows"][0]["status"] == "2/2 seeds"
    del experiment["final"]
    section = build_section(
        "reality",
        {**experiment, "seeds": [0, 1, 2]},
        aggregated,
        [],
        tmp_path / "b",
        reported_dir=tmp_path,
        method_configs={},
    )
    assert section["table"]["rows"][0]["status"] == "2/3 seeds"
