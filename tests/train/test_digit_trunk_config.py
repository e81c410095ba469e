"""A run config that fine-tunes from the digit-pretrained trunk (docs/models.md#the-digit-pretrained-trunk):
``model.pretrained: digit_trunk`` resolves ``model.digit_trunk`` in full, the recipe is part of the run id
(its folder is not), a bad recipe is a one-line config error, and the workflow's helpers name its file."""

from __future__ import annotations

import pytest

from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK, RECIPE_DEFAULTS
from dmlrepro.runs import run_id_for
from dmlrepro.train.config import ConfigError, resolve_run_config

BASE = {"dataset": {"name": "double_digits"}, "model": {"backbone": "tiny_cnn"}}


def _resolved(**model):
    return resolve_run_config({**BASE, "model": {**BASE["model"], **model}})


def _run_id(resolved):
    return run_id_for("proxy_anchor", "double_digits", resolved)


def test_the_recipe_resolves_in_full_and_enters_the_run_id():
    resolved = _resolved(pretrained="digit_trunk", digit_trunk={"seed": 1})
    assert resolved["model"]["digit_trunk"] == {**RECIPE_DEFAULTS, "seed": 1}
    other = _resolved(pretrained="digit_trunk", digit_trunk={"seed": 2})
    spelt_out = _resolved(pretrained="digit_trunk", digit_trunk={**RECIPE_DEFAULTS, "seed": 1})
    assert _run_id(resolved) != _run_id(other)  # another recipe, other weights: another run
    assert _run_id(resolved) == _run_id(spelt_out)  # the defaults spelt out: the same run
    assert _run_id(resolved) != _run_id(_resolved(pretrained=False))
    # the folder the workflow adds is a location, not part of the run id
    located = resolve_run_config(DIGIT_TRUNK.with_folder(resolved, "/elsewhere"))
    assert located["model"]["weights_cache_dir"] == "/elsewhere" and _run_id(located) == _run_id(resolved)


def test_the_recipe_is_ignored_without_the_trunk():
    """With any other ``pretrained`` the recipe is null: a preflight's random initialisation, or a run
    config that keeps a recipe around, is the run without it."""
    assert _resolved(digit_trunk={"seed": 1})["model"]["digit_trunk"] is None
    assert _run_id(_resolved(digit_trunk={"seed": 1})) == _run_id(_resolved())


@pytest.mark.parametrize(
    "model, message",
    [
        ({"digit_trunk": {"sede": 1}}, "model.digit_trunk: unknown key 'sede'"),
        ({"digit_trunk": {"epochs": 0}}, "model.digit_trunk.epochs = 0"),
        ({"digit_trunk": [1]}, "model.digit_trunk"),
        ({"digit_trunk": {"backbone": "resnet18"}}, "model.digit_trunk.backbone"),
        ({"digit_trunk": {"backbone_kwargs": {"widths": [8, 8, 8, 8]}}}, "model.digit_trunk.backbone_kwargs"),
        ({"pretrained": "digits"}, "model.pretrained"),
    ],
)
def test_a_bad_recipe_is_a_one_line_config_error(model, message):
    with pytest.raises(ConfigError) as error:
        _resolved(**{"pretrained": "digit_trunk", **model})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_workflow_names_the_weights_file(tmp_path):
    resolved = _resolved(pretrained="digit_trunk", digit_trunk={"seed": 1})
    assert DIGIT_TRUNK.run_weights(resolved, tmp_path) == [str(DIGIT_TRUNK.weights_file(tmp_path, {"seed": 1}))]
    assert (
        DIGIT_TRUNK.run_weights(_resolved(), tmp_path) == []
        and DIGIT_TRUNK.with_folder(_resolved(), tmp_path) == _resolved()
    )
