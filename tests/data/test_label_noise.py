from __future__ import annotations

import numpy as np
import pytest

from dmlrepro.data.dataset import ManifestDataset
from dmlrepro.data.label_noise import corrupt_labels, read_noisy_labels, write_noisy_labels
from dmlrepro.data.manifest import read_manifest, write_manifest


@pytest.fixture
def manifest(tmp_path):
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 20, size=1003)
    labels = np.concatenate([labels, np.arange(20, 30).repeat(3)])  # test classes after the train ones
    splits = ["train"] * 1003 + ["test"] * 30
    paths = [f"images/{i:05d}.png" for i in range(len(labels))]
    return write_manifest(tmp_path / "ds" / "manifest.csv", paths, labels, splits)


def test_exact_rate_never_true_label(manifest, tmp_path):
    out = write_noisy_labels(manifest, tmp_path / "noisy.csv", seed=3, rate=0.2)
    m = read_manifest(manifest)
    noisy = read_noisy_labels(out)
    tr = m.indices("train")
    assert set(noisy) == {m.paths[i] for i in tr}  # training rows only; the test set stays clean
    changed = [p for i, p in zip(tr, (m.paths[i] for i in tr)) if noisy[p] != m.labels[i]]
    assert len(changed) == round(0.2 * 1003) == 201
    train_classes = set(m.classes("train").tolist())
    assert set(noisy.values()) <= train_classes


def test_same_for_every_call_and_global_state(manifest, tmp_path):
    a = write_noisy_labels(manifest, tmp_path / "a.csv", seed=1).read_bytes()
    np.random.seed(123)  # global RNG states must not matter
    import torch

    torch.manual_seed(9)
    np.random.random(10)
    b = write_noisy_labels(manifest, tmp_path / "b.csv", seed=1).read_bytes()
    c = write_noisy_labels(manifest, tmp_path / "c.csv", seed=2).read_bytes()
    assert a == b and a != c


def test_uniform_over_other_classes():
    labels = np.repeat(np.arange(10), 3000)
    noisy = corrupt_labels(labels, seed=0, rate=1.0)
    assert np.all(noisy != labels)
    for c in (0, 5, 9):
        new = noisy[labels == c]
        counts = np.bincount(new, minlength=10)
        assert counts[c] == 0
        others = np.delete(counts, c)
        exp = 3000 / 9
        assert np.all(np.abs(others - exp) < 5 * np.sqrt(exp))  # binomial, 5 sigma


def test_any_mode_allows_true_label():
    labels = np.repeat(np.arange(4), 2500)
    noisy = corrupt_labels(labels, seed=0, rate=1.0, mode="any")
    same = np.mean(noisy == labels)
    assert abs(same - 0.25) < 0.03  # effective rate 1 - 1/C (mode 'any', PFML-R23)


def test_rate_and_mode_validation():
    with pytest.raises(ValueError, match="outside"):
        corrupt_labels([0, 1], seed=0, rate=1.5)
    with pytest.raises(ValueError, match="mode"):
        corrupt_labels([0, 1], seed=0, mode="pairs")


def test_dataset_label_override(manifest, tmp_path):
    out = write_noisy_labels(manifest, tmp_path / "n.csv", seed=4)
    ds = ManifestDataset(manifest, split="train", label_override=out)
    noisy = read_noisy_labels(out)
    assert [int(x) for x in ds.labels] == [noisy[p] for p in ds.paths]
    assert (ds.labels != ds.true_labels).sum() == round(0.2 * len(ds))
    clean = ManifestDataset(manifest, split="test", label_override=out)
    assert np.array_equal(clean.labels, clean.true_labels)


def test_the_rules_output_pattern_names_the_file_a_run_reads():
    """Rule label_noise's output (wildcards, as Snakemake fills them) is the path the run reads."""
    from snakemake.io import apply_wildcards

    from dmlrepro.data.label_noise import label_noise_file, label_noise_path

    pattern = str(label_noise_file("data", "{dataset}", "{rate}", "{seed}", "{mode}"))
    run = {"root": "data", "name": "cub200", "label_noise": {"rate": 0.2, "seed": 0, "mode": "other"}}
    filled = apply_wildcards(pattern, {"dataset": "cub200", "rate": "0.2", "seed": "0", "mode": "other"})
    assert filled == str(label_noise_path(run)) == "data/cub200/label_noise/rate0.2_seed0_other.csv"


def test_the_workflow_prepares_the_whole_splits_file_only_for_a_run_without_a_validation_split():
    """PFML Table 2 corrupts the labels a run trains on: a run holding classes out writes its own file."""
    from dmlrepro.data.label_noise import label_noise_path, prepared_noise_file

    run = {"root": "data", "name": "cub200", "label_noise": {"rate": 0.2, "seed": 0, "mode": "other"}}
    assert prepared_noise_file(run, None) == label_noise_path(run) == prepared_noise_file(run, {"split": None})
    assert prepared_noise_file(run, {"split": "fold", "n_folds": 5, "fold": 4}) is None
    assert prepared_noise_file({**run, "label_noise": None}, None) is None
