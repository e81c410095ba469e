"""Query→gallery evaluation (In-Shop's protocol) through the engine, against a brute force."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dmlrepro.data import read_manifest, write_manifest
from dmlrepro.evaluation import load_embeddings
from dmlrepro.train import ConfigError, evaluate_run, resolve_run_config, train_run


@pytest.fixture(scope="module")
def inshop_like_root(data_root, tmp_path_factory):
    """digits re-split the In-Shop way: train classes for training, test items alternately query/gallery."""
    root = tmp_path_factory.mktemp("qg")
    shutil.copytree(data_root / "digits", root / "inshop")
    m = read_manifest(root / "inshop" / "manifest.csv")
    splits, seen = [], 0
    for split in m.splits:
        if split == "test":
            split = ("query", "gallery")[seen % 2]
            seen += 1
        splits.append(split)
    write_manifest(root / "inshop" / "manifest.csv", m.paths, m.labels, splits)
    return root


def brute_force_recall(query, query_labels, gallery, gallery_labels, k):
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    order = np.argsort(-(q.astype(np.float64) @ g.T.astype(np.float64)), axis=1, kind="stable")[:, :k]
    return float(np.mean([(gallery_labels[row] == label).any() for row, label in zip(order, query_labels)]))


@pytest.mark.slow
def test_query_gallery_metrics_match_brute_force_and_survive_re_evaluation(tiny, inshop_like_root, tmp_path):
    cfg = tiny(
        dataset__name="inshop",
        dataset__root=str(inshop_like_root),
        dataset__test_split="query",
        dataset__gallery_split="gallery",
        eval__every=0,
        eval__before_training=False,
    )
    record = train_run(cfg, tmp_path / "run", progress=False)
    assert record["status"] == "completed" and record["gallery_file"] == "embeddings_gallery.npz"
    query = load_embeddings(tmp_path / "run" / "embeddings_test.npz")
    gallery = load_embeddings(tmp_path / "run" / "embeddings_gallery.npz")
    assert (query.split, gallery.split) == ("query", "gallery") and len(query) + len(gallery) > 300
    for k in (1, 2):
        expected = brute_force_recall(query.embeddings, query.labels, gallery.embeddings, gallery.labels, k)
        assert record["metrics"][f"recall@{k}"] == pytest.approx(expected, abs=1e-9)
    for name in ("embeddings_test.npz", "embeddings_gallery.npz"):
        (tmp_path / "run" / name).unlink()
    again = evaluate_run(tmp_path / "run", progress=False)  # both sets rebuilt from the final checkpoint
    assert again["metrics"] == pytest.approx(record["metrics"])
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["gallery_file"] == "embeddings_gallery.npz"


def test_gallery_split_must_differ_from_test_split(tiny):
    with pytest.raises(ConfigError, match="dataset.gallery_split"):
        resolve_run_config(tiny(dataset__test_split="query", dataset__gallery_split="query"))
