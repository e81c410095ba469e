"""The preflight's data and weights for the multi-digit datasets (docs/data.md#multi-digit-mnist): an
unprepared double_mnist / triple_mnist is a stand-in with the protocol's training counts, and a run that
fine-tunes from an unbuilt digit trunk is measured from random initialisation with one warning (the
projection of an unprepared one: tests/preflight/test_preflight_cli.py)."""

from __future__ import annotations

import csv

import pytest

from dmlrepro.data.multidigit import expected_counts, prepared_dependencies
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK
from dmlrepro.preflight.sources import data_source, missing_weights, weights_warning


@pytest.mark.parametrize("name, per_class, classes", [("double_mnist", 5, 80), ("triple_mnist", 3, 800)])
def test_an_unprepared_multidigit_set_is_a_stand_in(tmp_path, name, per_class, classes):
    cfg = {"name": name, "image_size": 32, "params": {"images_per_class": per_class}}
    source = data_source(cfg, tmp_path / "data", tmp_path / "scratch")
    assert source.root == str(tmp_path / "scratch") and "stand-in images" in source.note
    with open(tmp_path / "scratch" / name / "manifest.csv") as f:
        rows = list(csv.DictReader(f))
    train = [r for r in rows if r["split"] == "train"]
    assert len(train) == classes * per_class == expected_counts(name, per_class)["train_images"]
    assert len({r["label"] for r in train}) == classes


def test_an_unbuilt_trunk_is_random_initialisation(tmp_path):
    model = {"backbone": "tiny_cnn", "pretrained": "digit_trunk", "digit_trunk": {"seed": 1}}
    model["weights_cache_dir"] = str(tmp_path)
    assert missing_weights(model) == "digit_trunk"
    assert "rule pretrain_digit_trunk" in weights_warning("digit_trunk")
    DIGIT_TRUNK.weights_file(tmp_path, {"seed": 1}).write_bytes(b"")
    assert missing_weights(model) is None


def test_the_mnist_sets_are_made_from_a_prepared_mnist():
    assert prepared_dependencies("double_mnist", {}) == ["mnist"] == prepared_dependencies("triple_mnist", None)
    assert prepared_dependencies("double_mnist", {"source": "/copy"}) == []
    assert prepared_dependencies("double_digits", {}) == [] == prepared_dependencies("cub", {})
