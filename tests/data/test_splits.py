"""Split rules against the papers' class ranges and counts, at the real dataset sizes."""

from __future__ import annotations

import numpy as np
import pytest

from dmlrepro.data.benchmarks import BENCHMARKS, read_cars, read_cub, read_sop
from dmlrepro.data.manifest import Manifest, ManifestError, check_counts
from dmlrepro.data.splits import holdout_split, kfold_class_splits, sample_holdout, split_indices, standard_split

from .conftest import cars_mat_bytes


def per_class_counts(n_images: int, n_classes: int) -> list[int]:
    base, extra = divmod(n_images, n_classes)
    return [base + (c < extra) for c in range(n_classes)]


def manifest_from_rows(rows) -> Manifest:
    return Manifest(root=None, paths=list(rows.paths), labels=np.asarray(rows.labels), splits=np.asarray(rows.splits))


def test_cub_real_counts(tmp_path):
    """11,788 images / 200 classes laid out as in CUB_200_2011 (index files only): classes 1-100
    (label 0-99) train with 5,864 images, 101-200 test with 5,924 — the papers' numbers."""
    counts = per_class_counts(5864, 100) + per_class_counts(5924, 100)
    rng = np.random.default_rng(0)
    cls = np.repeat(np.arange(1, 201), counts)
    order = rng.permutation(len(cls))  # image ids are not sorted by class in general
    cls = cls[order]
    root = tmp_path / "CUB_200_2011"
    root.mkdir()
    (root / "images.txt").write_text("".join(f"{i + 1} {c:03d}.X/img_{i}.jpg\n" for i, c in enumerate(cls)))
    (root / "image_class_labels.txt").write_text("".join(f"{i + 1} {c}\n" for i, c in enumerate(cls)))
    m = manifest_from_rows(read_cub(tmp_path))
    check_counts(m, BENCHMARKS["cub200"].expected_counts, "cub")  # raises on any mismatch
    assert m.classes("train").tolist() == list(range(100)) and m.classes("test").tolist() == list(range(100, 200))
    assert np.array_equal(m.labels, cls - 1)


def test_cars_real_counts(tmp_path):
    counts = per_class_counts(8054, 98) + per_class_counts(8131, 98)
    cls = np.repeat(np.arange(1, 197), counts)
    cls = cls[np.random.default_rng(1).permutation(len(cls))]
    rel = [f"car_ims/{i + 1:06d}.jpg" for i in range(len(cls))]
    (tmp_path / "cars_annos.mat").write_bytes(cars_mat_bytes(rel, cls.tolist()))
    (tmp_path / "car_ims").mkdir()
    m = manifest_from_rows(read_cars(tmp_path))
    check_counts(m, BENCHMARKS["cars196"].expected_counts, "cars")
    assert m.classes("train").tolist() == list(range(98)) and m.classes("test").tolist() == list(range(98, 196))
    assert m.paths[:2] == rel[:2]


def test_sop_real_counts(tmp_path):
    root = tmp_path / "Stanford_Online_Products"
    root.mkdir()
    k = 0
    cid = 0
    for split, n_img, n_cls in (("train", 59551, 11318), ("test", 60502, 11316)):
        lines = ["image_id class_id super_class_id path"]
        for n in per_class_counts(n_img, n_cls):
            cid += 1
            for j in range(n):
                k += 1
                lines.append(f"{k} {cid} {1 + cid % 12} bicycle_final/{cid}_{j}.JPG")
        (root / f"Ebay_{split}.txt").write_text("\n".join(lines) + "\n")
    m = manifest_from_rows(read_sop(tmp_path))
    check_counts(m, BENCHMARKS["sop"].expected_counts, "sop")
    assert m.classes("train").tolist() == list(range(11318))
    assert m.classes("test").tolist() == list(range(11318, 22634))
    # one class fewer in train -> strict mode names the mismatch
    bad = Manifest(None, m.paths, np.where(m.labels == 0, 1, m.labels), m.splits)
    with pytest.raises(ManifestError, match="train_classes: expected 11318, got 11317"):
        check_counts(bad, BENCHMARKS["sop"].expected_counts, "sop")


def test_standard_split_first_half():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(196), 3))
    s = np.asarray(standard_split(labels))
    assert set(labels[s == "train"]) == set(range(98)) and set(labels[s == "test"]) == set(range(98, 196))


def _is_wrapping_contiguous(idx: np.ndarray, c: int) -> bool:
    """True if the sorted positions form one run modulo c."""
    s = set(idx.tolist())
    starts = [i for i in s if (i - 1) % c not in s]
    return len(starts) == 1


@pytest.mark.parametrize("c", [100, 98, 11318, 50])
def test_kfold_mlrc_properties(c):
    classes = np.arange(1000, 1000 + c)  # arbitrary ids: the rule works on sorted positions
    folds = kfold_class_splits(classes, 4, "mlrc")
    assert len(folds) == 4
    n_val = int(2 * c * 0.125)
    for tr, va in folds:
        assert set(tr).isdisjoint(va)  # class-disjoint
        assert set(tr) | set(va) == set(classes)  # every fold uses all training classes
        assert len(va) == n_val
        assert _is_wrapping_contiguous(np.searchsorted(classes, va), c)
        assert _is_wrapping_contiguous(np.searchsorted(classes, tr), c)
    vals = [set(v) for _, v in folds]
    assert all(vals[i].isdisjoint(vals[j]) for i in range(4) for j in range(i + 1, 4))


def test_kfold_mlrc_cub_exact():
    """MLRCSplitManager on CUB's 100 train classes: fold p starts at 25p; 75 train then 25 val."""
    folds = kfold_class_splits(range(100), 4, "mlrc")
    assert [v.tolist() for _, v in folds] == [
        list(range(75, 100)),
        list(range(0, 25)),
        list(range(25, 50)),
        list(range(50, 75)),
    ]
    assert folds[2][0].tolist() == list(range(0, 25)) + list(range(50, 100))  # wraps around
    assert set().union(*[set(v) for _, v in folds]) == set(range(100))  # covers all train classes


def test_kfold_mlrc_cars_quirk():
    """Cars (98 classes): val quarters of 24 starting at int(p*98/4)+74 -> classes 24 and 73 are
    never validated (hand-derived from MLRCSplitManager; documented in docs/data.md)."""
    folds = kfold_class_splits(range(98), 4, "mlrc")
    assert [v.tolist() for _, v in folds] == [
        list(range(74, 98)),
        list(range(0, 24)),
        list(range(25, 49)),
        list(range(49, 73)),
    ]
    assert set(range(98)) - set().union(*[set(v) for _, v in folds]) == {24, 73}


@pytest.mark.parametrize(
    "c, sizes", [(100, [25, 25, 25, 25]), (98, [24, 25, 24, 25]), (11318, [2829, 2830, 2829, 2830])]
)
def test_kfold_linspace(c, sizes):
    """ASAP's rule: partitions at np.linspace(0, C, 5); ASAP-R33 gives Cars 24/25/24/25."""
    folds = kfold_class_splits(range(c), 4, "linspace")
    assert [len(v) for _, v in folds] == sizes
    assert sorted(np.concatenate([v for _, v in folds]).tolist()) == list(range(c))  # covers all, once
    for tr, va in folds:
        assert set(tr).isdisjoint(va) and len(tr) + len(va) == c
        assert va.tolist() == list(range(va[0], va[-1] + 1))


def test_holdout_rsw():
    tr, va = holdout_split(range(100))
    assert tr.tolist() == list(range(50)) and va.tolist() == list(range(50, 100))
    tr, va = holdout_split(range(11318))
    assert len(tr) == len(va) == 5659 and tr[-1] == 5658  # RSW: class_id - 1 < 5659


def brute_force_sample_holdout(labels, fraction):
    """Per class, walk its images backwards in manifest order and hold out round(fraction · n_c)
    of them, at least 1 and at most n_c − 1."""
    val = set()
    for c in set(labels):
        pos = [i for i, label in enumerate(labels) if label == c]
        k = round(len(pos) * fraction)
        k = min(max(k, 1), len(pos) - 1)
        val |= set(pos[::-1][:k])
    return sorted(set(range(len(labels))) - val), sorted(val)


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.9])
def test_sample_holdout_equals_brute_force(fraction):
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 7, 200).tolist() + [9]  # class 9 has one image: it only trains
    tr, va = sample_holdout(labels, fraction)
    assert (tr.tolist(), va.tolist()) == brute_force_sample_holdout(labels, fraction)
    assert 9 not in {labels[i] for i in va}
    assert {labels[i] for i in va} == set(range(7))  # every class with two or more images validates


def test_sample_holdout_mnist_size():
    """MNIST's 60,000 training images, ~6,000 per digit: 10 % of each class validate (5,999 after rounding per
    class)."""
    counts = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]  # MNIST train per digit
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), counts))
    tr, va = sample_holdout(labels, 0.1)
    assert len(va) == sum(round(n * 0.1) for n in counts) == 5999 and len(tr) == 54001
    assert np.bincount(labels[va]).tolist() == [round(n * 0.1) for n in counts]
    with pytest.raises(ValueError, match="fraction"):
        sample_holdout(labels, 1.0)


def test_split_indices_on_manifest():
    labels = np.repeat(np.arange(8), 2)
    splits = np.where(labels < 4, "train", "test")
    m = Manifest(None, [f"{i}.png" for i in range(16)], labels, splits)
    assert split_indices(m, "test").tolist() == list(range(8, 16))
    val = split_indices(m, "fold_val", fold=1, scheme="linspace")
    assert labels[val].tolist() == [1, 1]
    tr = split_indices(m, "fold_train", fold=1, scheme="linspace")
    assert sorted(set(labels[tr].tolist())) == [0, 2, 3]
    assert labels[split_indices(m, "holdout_val")].tolist() == [2, 2, 3, 3]
    val = split_indices(m, "samples_val", fraction=0.5)  # not class-disjoint: one image of each training class
    assert val.tolist() == [1, 3, 5, 7]
    assert split_indices(m, "samples_train", fraction=0.5).tolist() == [0, 2, 4, 6]
    with pytest.raises(ValueError, match="needs fold"):
        split_indices(m, "fold_val")
    with pytest.raises(ValueError, match="unknown subset"):
        split_indices(m, "validation")
