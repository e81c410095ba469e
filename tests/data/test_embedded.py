"""The embedded datasets: synthetic (seeded, byte-identical) and scikit-learn digits."""

from __future__ import annotations

import hashlib
import time

import numpy as np
from PIL import Image

from dmlrepro.data.manifest import read_manifest
from dmlrepro.data.registry import expected_train_images, prepare
from dmlrepro.data.sanity import recall_at_1


def tree_digest(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*.png"))}


def test_synthetic_default_and_timing(tmp_path):
    t0 = time.perf_counter()
    path = prepare("synthetic", tmp_path, progress=False)
    dt = time.perf_counter() - t0
    m = read_manifest(path)
    print(f"\nsynthetic default ({len(m)} images, {len(m.classes())} classes): generated in {dt:.2f} s")
    assert len(m.classes()) == 128 and len(m) == 128 * 40
    assert set(m.classes("train")).isdisjoint(m.classes("test"))
    assert m.classes("train").tolist() == list(range(64))
    with Image.open(m.abspath(0)) as im:
        assert im.size == (32, 32) and im.mode == "RGB"
    # sub-modes: within a class the mean colours form (at least) two distinct groups
    means = np.array([np.asarray(Image.open(m.abspath(i)), float).reshape(-1, 3).mean(0) for i in range(40)])
    assert means.std(0).max() > 5


def test_synthetic_sub_modes_distinct_fine_cue_flip_symmetric():
    from dmlrepro.data.synthetic import class_specs

    specs = class_specs(128, 2, 4, seed=0)
    for c in range(0, 128, 4):
        a, b = specs[c]["modes"]
        assert a["shape"] != b["shape"]
        assert 0.3 <= abs(a["hue"] - b["hue"]) % 1.0 <= 0.7  # hues far apart on the circle
        fam = specs[c : c + 4]
        assert all(s["modes"] == specs[c]["modes"] for s in fam)  # a family shares its modes
        assert len({(s["dots"], s["dots_up"]) for s in fam}) == 4  # ... and differs by the marker


def test_synthetic_byte_identical_for_seed(tmp_path):
    kw = dict(num_classes=100, images_per_class=2, size=48, progress=False)
    a = tree_digest(prepare("synthetic", tmp_path / "a", seed=3, **kw).parent)
    b = tree_digest(prepare("synthetic", tmp_path / "b", seed=3, **kw).parent)
    c = tree_digest(prepare("synthetic", tmp_path / "c", seed=4, **kw).parent)
    assert len(a) == 200 and a == b
    assert set(a) == set(c) and all(a[k] != c[k] for k in a)
    assert (tmp_path / "a/synthetic/manifest.csv").read_bytes() == (tmp_path / "b/synthetic/manifest.csv").read_bytes()
    with Image.open(tmp_path / "a/synthetic/images/c0000/0000.png") as im:
        assert im.size == (48, 48)
    # a prepared folder with other parameters is regenerated, not silently reused
    prepare("synthetic", tmp_path / "a", seed=4, **kw)
    assert tree_digest(tmp_path / "a/synthetic") == c


def test_digits(tmp_path):
    from sklearn.datasets import load_digits

    m = read_manifest(prepare("digits", tmp_path, progress=False))
    d = load_digits()
    assert len(m) == 1797 and m.classes("train").tolist() == [0, 1, 2, 3, 4]
    assert len(m.indices("train")) == int((d.target < 5).sum()) == expected_train_images("digits")
    assert m.classes("test").tolist() == [5, 6, 7, 8, 9]
    # file i is sklearn's image i: shrink it back to 8x8 and compare with the original pixels
    for i in (0, 500, 1796):
        j = m.paths.index(f"images/{d.target[i]}/{i:04d}.png")
        assert m.labels[j] == d.target[i]
        a = np.asarray(Image.open(m.abspath(j)).convert("L").resize((8, 8), Image.BOX), float)
        assert np.corrcoef(a.ravel(), d.images[i].ravel())[0, 1] > 0.9
    with Image.open(m.abspath(0)) as im:
        assert im.size == (32, 32) and im.mode == "RGB"


def test_recall_at_1_against_sklearn():
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 5))
    y = rng.integers(0, 6, 300)
    nn = NearestNeighbors(n_neighbors=2, algorithm="brute").fit(x)
    idx = nn.kneighbors(x, return_distance=False)[:, 1]
    assert recall_at_1(x, y, chunk=64) == np.mean(y[idx] == y)
