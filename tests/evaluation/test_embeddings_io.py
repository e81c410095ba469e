"""Embeddings file round trip, atomic writes, metrics.json, and the MLRC concatenation helper."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from dmlrepro.evaluation import (
    concatenate_fold_embeddings,
    evaluate_embeddings_file,
    load_embeddings,
    nmi,
    retrieval_metrics,
    retrieval_metrics_query_gallery,
    save_embeddings,
    write_json_atomic,
)
from dmlrepro.evaluation.embeddings_io import atomic_write


def _data(n=120, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 12, size=n)
    x = rng.normal(size=(12, dim))[y] + 0.8 * rng.normal(size=(n, dim))
    return x.astype(np.float32), y


def test_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    x, y = _data()
    idx = np.arange(len(x)) * 3 + 1
    path = save_embeddings(tmp_path / "emb" / "test.npz", torch.from_numpy(x), y, idx, split="test", meta={"run": "r1"})
    e = load_embeddings(path)
    assert e.embeddings.dtype == np.float32
    np.testing.assert_array_equal(e.embeddings, x)
    np.testing.assert_array_equal(e.labels, y)
    np.testing.assert_array_equal(e.indices, idx)
    assert e.split == "test" and e.meta["run"] == "r1" and e.meta["format_version"] == 1
    assert len(e) == len(x)
    # default indices
    e2 = load_embeddings(save_embeddings(tmp_path / "b.npz", x, y, split="val"))
    np.testing.assert_array_equal(e2.indices, np.arange(len(x)))
    assert e2.split == "val"
    # nothing but the two files was left in the folders
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["b.npz", "test.npz"]


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = tmp_path / "metrics.json"
    write_json_atomic(path, {"a": 1})

    def boom(f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, boom)
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["metrics.json"]  # temp file removed
    with pytest.raises(ValueError):
        write_json_atomic(path, {"a": float("nan")})  # invalid JSON is refused
    assert json.loads(path.read_text()) == {"a": 1}


def test_load_rejects_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load_embeddings(tmp_path / "missing.npz")
    np.savez(tmp_path / "bad.npz", embeddings=np.zeros((3, 2)), labels=np.zeros(3))
    with pytest.raises(ValueError, match=r"bad.npz: missing key\(s\) \['indices', 'split'\]"):
        load_embeddings(tmp_path / "bad.npz")
    np.savez(
        tmp_path / "bad2.npz",
        embeddings=np.zeros((3, 2)),
        labels=np.zeros(4),
        indices=np.arange(3),
        split=np.array("test"),
    )
    with pytest.raises(ValueError, match="'labels' has shape"):
        load_embeddings(tmp_path / "bad2.npz")


def test_evaluate_file_writes_metrics_json(tmp_path):
    x, y = _data()
    y[0] = 99  # one lone class
    emb = save_embeddings(tmp_path / "test.npz", x, y, split="test")
    out = evaluate_embeddings_file(emb, tmp_path / "metrics.json", ks=(1, 2, 4), nmi=True, extra_metrics={"w2": 0.25})
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk == out
    expected = retrieval_metrics(x, y, ks=(1, 2, 4))
    for key, value in expected.items():
        assert on_disk["metrics"][key] == pytest.approx(value, abs=1e-12)
    assert on_disk["metrics"]["nmi"] == pytest.approx(nmi(x, y, seed=0), abs=1e-12)
    assert on_disk["metrics"]["w2"] == 0.25
    assert on_disk["split"] == "test" and on_disk["num_items"] == len(x)
    assert on_disk["num_queries"] == len(x) - 1 and on_disk["num_excluded_queries"] == 1
    with pytest.raises(ValueError, match="collides"):
        evaluate_embeddings_file(emb, None, extra_metrics={"map@r": 0.0})


def test_evaluate_file_query_gallery(tmp_path):
    x, y = _data(200)
    q = save_embeddings(tmp_path / "query.npz", x[:80], y[:80], split="query")
    g = save_embeddings(tmp_path / "gallery.npz", x[80:], y[80:], split="gallery")
    out = evaluate_embeddings_file(q, tmp_path / "m.json", ks=(1, 10), gallery_path=g)
    expected = retrieval_metrics_query_gallery(x[:80], y[:80], x[80:], y[80:], ks=(1, 10))
    for key, value in expected.items():
        assert out["metrics"][key] == pytest.approx(value, abs=1e-12)
    assert out["gallery_file"] == "gallery.npz"


def test_concatenate_fold_embeddings():
    rng = np.random.default_rng(0)
    folds = [rng.normal(size=(50, 4)) * s for s in (0.5, 2.0, 10.0)]
    c = concatenate_fold_embeddings(folds)
    assert c.shape == (50, 12) and c.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-6)
    # each fold contributes a normalised block of equal weight: block norms are 1/sqrt(3)
    for b in range(3):
        np.testing.assert_allclose(np.linalg.norm(c[:, 4 * b : 4 * b + 4], axis=1), 3**-0.5, rtol=1e-5)
    expected = np.concatenate([f / np.linalg.norm(f, axis=1, keepdims=True) for f in folds], 1)
    np.testing.assert_allclose(c, expected / np.sqrt(3), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="same items"):
        concatenate_fold_embeddings([folds[0], folds[1][:10]])
