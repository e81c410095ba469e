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


def test_the_preflight_finds_the_trunk_the_workflow_built(tmp_path, monkeypatch, capsys):
    """From the CLI as from rule preflight: a trunk in `<results>/standin` is the run's weights (no warning,
    no random initialisation); before it is built, the one warning says where it was looked for."""
    from dmlrepro.preflight.cli import _prepare
    from dmlrepro.preflight.shapes import group_runs

    monkeypatch.setenv("DMLREPRO_WEIGHTS", str(tmp_path / "empty_cache"))
    recipe = {"dataset": "double_digits", "backbone": "tiny_cnn", "size": 32, "epochs": 1}
    model = {"backbone": "tiny_cnn", "embedding_size": 8, "pretrained": "digit_trunk", "digit_trunk": recipe}
    config = {
        "data_root": str(tmp_path / "data"),
        "results": str(tmp_path / "results"),
        "defaults": {"model": model, "dataset": {"image_size": 32, "batch_size": 8}, "epochs": 1},
        "datasets": {"digits": {"dataset": {"name": "double_digits"}}},
        "methods": {"pa": {"loss": {"name": "proxy_anchor"}}},
        "experiments": {"table": {"methods": ["pa"], "datasets": ["digits"], "seeds": [0]}},
    }
    (shape,), _, _ = group_runs(config)
    trunk_dir = tmp_path / "results" / "standin"

    def prepare():
        return _prepare(shape, "cpu", None, config["data_root"], tmp_path / "scratch", set(), config["results"])

    run_cfg, weights, _ = prepare()
    assert weights == "digit_trunk" and run_cfg["model"]["pretrained"] is False
    assert f"not built yet in {trunk_dir}" in capsys.readouterr().err
    weights_file = DIGIT_TRUNK.weights_file(trunk_dir, DIGIT_TRUNK.of_config(shape.config))
    weights_file.parent.mkdir(parents=True)
    weights_file.write_bytes(b"")
    run_cfg, weights, _ = prepare()
    assert weights is None and run_cfg["model"]["pretrained"] == "digit_trunk"
    assert run_cfg["model"]["weights_cache_dir"] == str(trunk_dir) and capsys.readouterr().err == ""
