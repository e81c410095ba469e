"""The stand-in's recipe is part of a fine-tuned run's id; its folder is not (docs/miniature.md): changing the
pretraining recipe changes exactly the ids of the runs that fine-tune from it, moving the results or the
weights folder changes none."""

import copy

from dmlrepro.runs import config_hash, resolve_runs
from dmlrepro.standin_recipe import STANDIN

EXPERIMENTS = ["pfml_table1", "rsw_fig10_toy"]  # synthetic runs (stand-in) and digits runs (from scratch)


def _ids(config):
    return {(r.method, r.dataset, r.seed): r.run_id for r in resolve_runs(config, EXPERIMENTS).values()}


def test_recipe_change_changes_exactly_the_finetuned_ids(standin_config):
    base = standin_config
    changed = copy.deepcopy(base)
    changed["datasets"]["synthetic"]["model"]["standin"]["epochs"] += 1
    before, after = _ids(base), _ids(changed)
    assert before.keys() == after.keys()
    for key in before:
        assert (before[key] != after[key]) == (key[1] == "synthetic"), key
    assert any(key[1] == "digits" for key in before)


def test_location_changes_no_id(standin_config):
    base = standin_config
    moved = {**copy.deepcopy(base), "results": "/elsewhere/results", "data_root": "/elsewhere/data"}
    assert _ids(base) == _ids(moved)


def test_weights_folder_is_not_identity_but_is_the_input(standin_config):
    runs = resolve_runs(standin_config, EXPERIMENTS)
    ((digest, recipe),) = STANDIN.workflow_recipes(runs).items()
    assert digest == STANDIN.hash(recipe)
    for run in runs.values():
        a, b = STANDIN.with_folder(run.config, "/a/standin"), STANDIN.with_folder(run.config, "/b/standin")
        assert config_hash(a) == config_hash(b) == config_hash(run.config)
        if run.dataset == "synthetic":
            assert STANDIN.run_weights(run.config, "/a/standin") == [f"/a/standin/standin-{digest}.pt"]
            assert a["model"]["weights_cache_dir"] == "/a/standin"
        else:
            assert STANDIN.run_weights(run.config, "/a/standin") == [] and a == run.config


def test_run_config_checks_the_recipe():
    import pytest

    from dmlrepro.train.config import ConfigError, resolve_run_config

    resolved = resolve_run_config({"model": {"pretrained": "standin", "standin": {"epochs": 3}}})["model"]["standin"]
    assert resolved["epochs"] == 3 and resolved["classes"]["seed"] == 1  # resolved in full: all of it is identity
    for bad, match in [
        ({"epoch": 3}, "unknown key 'epoch'"),
        ({"classes": {"sed": 1}}, "unknown key"),
        ({"epochs": 0}, "epochs"),
        ({"backbone": "resnet18"}, "the run's backbone"),
    ]:
        with pytest.raises(ConfigError, match=match):
            resolve_run_config({"model": {"pretrained": "standin", "standin": bad}})
    # another pretrained value ignores the recipe (a preflight's random initialisation): no identity of its own
    assert resolve_run_config({"model": {"pretrained": False, "standin": {"epochs": 3}}})["model"]["standin"] is None


def test_the_rules_output_pattern_names_the_file_a_run_loads(tmp_path, standin_config):
    """Rule pretrain_standin's output (its wildcard filled with a recipe's hash) is the run's weights file."""
    from snakemake.io import apply_wildcards

    recipe = next(iter(STANDIN.workflow_recipes(resolve_runs(standin_config, EXPERIMENTS)).values()))
    pattern = str(STANDIN.weights_file_of_hash(tmp_path, "{standin}"))
    filled = apply_wildcards(pattern, {"standin": STANDIN.hash(recipe)})
    assert filled == str(STANDIN.weights_file(tmp_path, recipe)) and filled.endswith(
        f"standin-{STANDIN.hash(recipe)}.pt"
    )
