"""The ImageNet stand-in is generic: it is pretrained without the cue the default's test classes are told
apart by (docs/models.md#the-generated-stand-in), on the default's tables as they ran on `synthetic`
(tests/pretrain/conftest.py).

`synthetic`'s classes come in families that share their glyphs (the family's modes: shape, hue, inset)
and differ only by a marker (1-2 dots above or below the centre; dmlrepro.data.synthetic). The stand-in
must (a) share no family's glyphs with any run's classes and (b) never be trained to tell classes apart
by the marker: each family of its pretraining classes has one class, so its labels are a function of
the glyphs and the marker carries no label information, as ImageNet carries none about the cues that
separate CUB's species."""

import copy

import yaml

from dmlrepro.data.synthetic import DEFAULTS, class_specs
from dmlrepro.runs import resolve_runs
from dmlrepro.standin_recipe import RECIPE_DEFAULTS, STANDIN


def _specs(params):
    p = {**DEFAULTS, **params}
    return class_specs(p["num_classes"], p["modes"], p["family_size"], p["seed"])


def marker_cues(specs):
    """The markers ``(dots, above)`` that tell two classes of one family apart (empty: the labels never
    depend on the marker)."""
    by_family: dict[int, list[tuple[int, bool]]] = {}
    for spec in specs:
        by_family.setdefault(spec["family"], []).append((spec["dots"], spec["dots_up"]))
    return {marker for markers in by_family.values() if len(markers) > 1 for marker in markers}


def glyphs(specs):
    """Every family's modes (its glyphs), as comparable text."""
    return {yaml.safe_dump(spec["modes"]) for spec in specs}


def _cue_overlap(config):
    runs = resolve_runs(config)
    run_specs = [
        _specs(r.config["dataset"]["params"]) for r in runs.values() if r.config["dataset"]["name"] == "synthetic"
    ]
    recipes = list(STANDIN.workflow_recipes(runs).values())
    assert run_specs and recipes
    standin_specs = [_specs(recipe["classes"]) for recipe in recipes]
    return run_specs, standin_specs


def test_the_test_classes_are_told_apart_by_the_marker(standin_config):
    """The check below is not vacuous: within the runs' families, the marker is the only difference."""
    run_specs, _ = _cue_overlap(standin_config)
    for specs in run_specs:
        assert marker_cues(specs) == {(1, True), (1, False), (2, True), (2, False)}


def test_the_standin_learns_neither_the_marker_nor_the_runs_glyphs(standin_config):
    run_specs, standin_specs = _cue_overlap(standin_config)
    for specs in standin_specs:
        assert marker_cues(specs) == set()
        assert not any(glyphs(specs) & glyphs(run) for run in run_specs)
    assert marker_cues(_specs(RECIPE_DEFAULTS["classes"])) == set()  # the recipe's default is generic too


def test_the_check_sees_a_standin_that_learns_the_marker(standin_config):
    """A stand-in pretrained on families of four (the runs' marker code) is caught."""
    bad = copy.deepcopy(standin_config)
    bad["datasets"]["synthetic"]["model"]["standin"]["classes"]["family_size"] = 4
    _, standin_specs = _cue_overlap(bad)
    assert marker_cues(standin_specs[0]) == {(1, True), (1, False), (2, True), (2, False)}
