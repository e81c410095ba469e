"""The ImageNet stand-in pretrains on generated classes that no run fine-tuning it trains or tests on
(the default's tables on `synthetic`, tests/pretrain/conftest.py): no generator key (seed, class index)
and no class description is shared (docs/miniature.md)."""

import copy

import pytest
import yaml

from dmlrepro.data.synthetic import DEFAULTS, class_keys, class_specs
from dmlrepro.runs import resolve_runs
from dmlrepro.standin_recipe import STANDIN


def _run_class_params(runs):
    """The generator parameters of every synthetic dataset a run trains or tests on (both halves)."""
    return [
        {**DEFAULTS, **run.config["dataset"]["params"]}
        for run in runs.values()
        if run.config["dataset"]["name"] == "synthetic"
    ]


def _overlap(recipe_classes, run_params):
    """Shared generator keys and shared class descriptions (the family's modes and the marker)."""
    keys = class_keys(**recipe_classes)
    specs = {
        yaml.safe_dump(s)
        for s in class_specs(
            recipe_classes["num_classes"],
            recipe_classes["modes"],
            recipe_classes["family_size"],
            recipe_classes["seed"],
        )
    }
    shared_keys, shared_specs = set(), set()
    for p in run_params:
        shared_keys |= keys & class_keys(**p)
        shared_specs |= specs & {
            yaml.safe_dump(s) for s in class_specs(p["num_classes"], p["modes"], p["family_size"], p["seed"])
        }
    return shared_keys, shared_specs


def test_standin_classes_are_disjoint_from_every_run_that_finetunes_it(standin_config):
    runs = resolve_runs(standin_config)
    recipes = STANDIN.workflow_recipes(runs)
    params = _run_class_params(runs)
    assert len(recipes) == 1 and params  # one stand-in, fine-tuned by the synthetic runs
    standin_runs = [r for r in runs.values() if r.config["model"]["pretrained"] == "standin"]
    assert {r.config["dataset"]["name"] for r in standin_runs} == {"synthetic"}
    for recipe in recipes.values():
        shared_keys, shared_specs = _overlap(recipe["classes"], params)
        assert not shared_keys and not shared_specs


def test_the_check_sees_a_shared_class(standin_config):
    """The same check on a recipe built to overlap (the runs' generator seed) reports the shared classes."""
    bad = copy.deepcopy(standin_config)
    bad["datasets"]["synthetic"]["model"]["standin"]["classes"]["seed"] = 0
    runs = resolve_runs(bad)
    (recipe,) = STANDIN.workflow_recipes(runs).values()
    shared_keys, shared_specs = _overlap(recipe["classes"], _run_class_params(runs))
    assert (0, 0) in shared_keys and len(shared_specs) > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_class_keys_determine_the_pixels(seed):
    """A class's images are a function of its key: the same key renders the same pixels in any parameter set."""
    from dmlrepro.data.synthetic import render_classes

    small, _ = render_classes(num_classes=4, images_per_class=2, size=16, seed=seed, modes=2, family_size=4)
    large, _ = render_classes(num_classes=8, images_per_class=2, size=16, seed=seed, modes=2, family_size=4)
    other, _ = render_classes(num_classes=4, images_per_class=2, size=16, seed=seed + 7, modes=2, family_size=4)
    assert (small == large[:8]).all() and not (small == other).all()
