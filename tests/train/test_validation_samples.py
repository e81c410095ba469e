"""`validation.split: samples` (ASAP's MNIST proof of concept, ASAP-R28: "10 % of train as
validation"): every training class trains and validates, on disjoint images; run ids of
configs that predate `validation.fraction` are unchanged."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from dmlrepro.train import ConfigError, resolve_run_config, train_run

from .test_validation_asap import asap_config


def samples_config(root, **overrides) -> dict:
    return asap_config(root, **{"validation__split": "samples", "validation__fraction": 0.25, **overrides})


def test_samples_split_trains_and_validates_every_class_on_disjoint_images(synth_root):
    from dmlrepro.train.model_and_loss import build_run_model
    from dmlrepro.train.run_data import build_datasets, build_validation, open_manifest

    cfg = resolve_run_config(samples_config(synth_root))
    manifest = open_manifest(cfg["dataset"])
    model = build_run_model(cfg)
    train, test, labelmap = build_datasets(cfg["dataset"], manifest, model, cfg["validation"])
    val = build_validation(cfg["dataset"], cfg["validation"], manifest, model)
    train_rows = manifest.indices("train")
    classes = np.unique(manifest.labels[train_rows])
    # brute force: per class, the last quarter of its training rows (manifest order) validate
    expected_val = []
    for c in classes:
        rows = [int(r) for r in train_rows if manifest.labels[r] == c]
        expected_val += rows[len(rows) - round(len(rows) * 0.25) :]
    assert sorted(val.rows.tolist()) == sorted(expected_val)
    assert sorted(train.rows.tolist()) == sorted(set(train_rows.tolist()) - set(expected_val))
    assert np.array_equal(np.unique(train.labels), classes) and np.array_equal(np.unique(val.labels), classes)
    assert len(labelmap) == len(classes)  # one proxy set per training class, all of them
    assert np.array_equal(np.sort(test.rows), np.sort(manifest.indices("test")))


@pytest.mark.slow
def test_asap_run_with_the_samples_split_completes(synth_root, tmp_path):
    metrics = train_run(samples_config(synth_root, epochs=3), tmp_path / "run", progress=False)
    assert metrics["status"] == "completed"
    log = json.loads((tmp_path / "run" / "validation_log.json").read_text())
    assert len(log["evaluations"]) == 3 and all(np.isfinite(e["map_r"]) for e in log["evaluations"])


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "a tenth"])
def test_bad_fraction_names_the_key(synth_root, bad):
    with pytest.raises(ConfigError, match="validation.fraction"):
        resolve_run_config(samples_config(synth_root, validation__fraction=bad))


def test_fraction_leaves_existing_run_ids_unchanged(synth_root):
    from dmlrepro.runs import config_hash

    fold = resolve_run_config(asap_config(synth_root))
    assert fold["validation"]["fraction"] == 0.1
    old = copy.deepcopy(fold)
    old["validation"].pop("fraction")  # a run directory's config.yaml written before the key existed
    assert config_hash(old) == config_hash(fold)
    other = resolve_run_config(asap_config(synth_root, validation__fraction=0.2))
    assert config_hash(other) != config_hash(fold)  # an explicit other value is another run


def test_a_stored_identity_without_fraction_splits_at_the_default(synth_root):
    """config.yaml / the report's run records drop `fraction` at 0.1: the same rows as an explicit 0.1."""
    from dmlrepro.train.config import config_identity
    from dmlrepro.train.run_data import open_manifest, validation_rows

    cfg = resolve_run_config(samples_config(synth_root, validation__fraction=0.1))
    stored = config_identity(cfg)["validation"]
    assert "fraction" not in stored and stored["split"] == "samples"
    manifest = open_manifest(cfg["dataset"])
    explicit, implicit = validation_rows(cfg["validation"], manifest), validation_rows(stored, manifest)
    assert all(np.array_equal(a, b) for a, b in zip(explicit, implicit))
    assert len(implicit[1]) > 0
