"""PFML Table 2's label noise in a run: the seeded corruption of the training labels."""

from __future__ import annotations

import numpy as np
import pytest

from dmlrepro.data.label_noise import label_noise_path
from dmlrepro.train import ConfigError, resolve_run_config, train_run
from dmlrepro.train.model_and_loss import build_run_model
from dmlrepro.train.run_data import build_datasets, build_train_eval, build_validation, open_manifest


def train_set(cfg):
    cfg = resolve_run_config(cfg)
    manifest = open_manifest(cfg["dataset"])
    train, _, _ = build_datasets(cfg["dataset"], manifest, build_run_model(cfg))
    return cfg, train


def test_a_fifth_of_the_training_labels_change_and_never_to_the_true_one(tiny):
    cfg, train = train_set(tiny(dataset__label_noise={"rate": 0.2, "seed": 1}))
    changed = train.labels != train.true_labels
    assert changed.sum() == round(0.2 * len(train))
    assert label_noise_path(cfg["dataset"]).is_file()
    assert set(np.unique(train.labels)) <= set(np.unique(train.true_labels))


def test_every_method_sees_the_same_noise_and_another_seed_differs(tiny):
    _, pfml = train_set(tiny(dataset__label_noise={"rate": 0.2, "seed": 1}))
    _, anchor = train_set(
        tiny(dataset__label_noise={"rate": 0.2, "seed": 1}, loss={"name": "proxy_anchor", "hparams": {}})
    )
    _, other = train_set(tiny(dataset__label_noise={"rate": 0.2, "seed": 2}))
    assert np.array_equal(pfml.labels, anchor.labels)
    assert not np.array_equal(pfml.labels, other.labels)


def test_with_a_validation_split_only_the_training_classes_are_corrupted_and_measured(tiny):
    """A held-out class never receives a noisy label (it would become a class of the run's proxies), and
    the proxy measures (W₂) embed the labels the run trains on."""
    noise = {"rate": 0.2, "seed": 1}
    cfg = resolve_run_config(tiny(dataset__label_noise=noise, validation={"split": "fold", "n_folds": 5, "fold": 4}))
    manifest, model = open_manifest(cfg["dataset"]), build_run_model(cfg)
    train, _, labelmap = build_datasets(cfg["dataset"], manifest, model, cfg["validation"])
    held_out = set(build_validation(cfg["dataset"], cfg["validation"], manifest, model).true_labels)
    assert held_out and not held_out & set(train.labels)
    assert (train.labels != train.true_labels).sum() == round(0.2 * len(train))
    measured = build_train_eval(cfg["dataset"], manifest, model, train.rows)
    assert np.array_equal(measured.labels, train.labels) and len(labelmap) == len(set(train.true_labels))


@pytest.mark.slow
def test_a_noisy_run_trains(tiny, tmp_path):
    assert (
        train_run(tiny(dataset__label_noise={"rate": 0.2, "seed": 1}), tmp_path / "run", progress=False)["status"]
        == "completed"
    )


@pytest.mark.parametrize(
    "noise,extra,key",
    [
        ({"rate": 1.5}, {}, "dataset.label_noise.rate"),
        ({"mode": "some"}, {}, "dataset.label_noise.mode"),
        ({"ratio": 0.2}, {}, "dataset.label_noise"),
        ({"rate": 0.2}, {"dataset__label_noise_file": "x.csv"}, "dataset.label_noise"),
    ],
)
def test_bad_noise_settings_name_the_key(tiny, noise, extra, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve_run_config(tiny(dataset__label_noise=noise, **extra))
