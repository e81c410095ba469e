"""The final stage of a search whose runs switch to the followup phase on a validation plateau
(followup.trigger: plateau, RSW App. D): the fold runs keep the trigger, the Complete runs (no
validation split) train the observed epochs per phase with the epochs trigger."""

import copy

import pytest

from dmlrepro.runs import ExperimentError, config_hash
from dmlrepro.train import resolve_run_config
from dmlrepro.tuning import observed_epochs
from dmlrepro.tuning.final import COMPLETE_KEY, final_runs
from dmlrepro.tuning.searches import search_runs

CONFIG = {
    "defaults": {
        "epochs": 40,
        "model": {"backbone": "tiny_cnn", "embedding_size": 16},
        "validation": {"split": "fold", "n_folds": 4, "scheme": "mlrc", "patience": 3},
    },
    "datasets": {"synthetic": {"dataset": {"name": "synthetic"}}},
    "methods": {
        "rsw": {"loss": {"name": "rsw"}, "followup": {"trigger": "plateau", "lr": 1e-5, "loss": {"alpha": 24.68}}}
    },
    "experiments": {
        "reality": {
            "methods": ["rsw"],
            "datasets": ["synthetic"],
            "search": {
                "space": {
                    "optimizer.lr": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True},
                    "followup.loss.k1": {"type": "float", "low": 0.5, "high": 1.0},
                },
                "trials": 3,
                "folds": [0, 1, 2, 3],
            },
            "final": {
                "seeds": [0, 1],
                "complete": {"model": {"embedding_size": 64}, "validation": {"split": None, "patience": None}},
            },
            "metrics": ["map@r@separated"],
        }
    },
}
BEST = {"optimizer.lr": 3e-4, "followup.loss.k1": 0.9}


def _search(config):
    (search,) = search_runs(config).values()  # plans the final stage too (a probe of the Complete runs)
    return search


def _split(runs):
    complete = [r for r in runs.values() if r.experiments["reality"].get(COMPLETE_KEY)]
    return [r for r in runs.values() if r not in complete], complete


def _log(path, phases):
    rows = ["epoch,phase,loss"] + [f"{i},{p},0.5" for i, p in enumerate(phases, start=1)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_fold_runs_keep_the_plateau_trigger_and_complete_runs_train_the_observed_epochs(tmp_path):
    # two fold runs: phase 1 for 9 and 13 epochs, phase 2 for 4 and 7 (their train_log.csv phases)
    logs = [_log(tmp_path / "a.csv", [1] * 9 + [2] * 4), _log(tmp_path / "b.csv", [1] * 13 + [2] * 7)]
    epochs = observed_epochs(logs)  # totals 13, 20 -> 16.5 -> 20; followup 4, 7 -> 5.5 -> 10
    assert (epochs["epochs"], epochs["followup_epochs"]) == (20, 10)
    folds, complete = _split(final_runs(CONFIG, "reality", _search(CONFIG), BEST, epochs))
    assert len(folds) == 2 * 4 and len(complete) == 2
    for run in folds:
        f = run.config["followup"]
        assert f["trigger"] == "plateau" and f["epochs"] == 0 and run.config["epochs"] == 40
        assert f["loss"] == {"alpha": 24.68, "k1": 0.9} and run.config["validation"]["patience"] == 3
    for run in complete:
        resolved = resolve_run_config(run.config)
        f = resolved["followup"]
        assert f["trigger"] == "epochs" and f["epochs"] == 10 and resolved["epochs"] == 20
        assert f["loss"] == {"alpha": 24.68, "k1": 0.9} and f["lr"] == 1e-5
        assert resolved["validation"]["split"] is None and resolved["model"]["embedding_size"] == 64
        # the same run as one written with the epochs trigger from the start (the default: not in its id)
        assert "trigger" not in run.config["followup"]
        fixed = copy.deepcopy(run.config)
        fixed["followup"]["trigger"] = "epochs"
        assert config_hash(resolve_run_config(fixed)) == config_hash(resolved)
        assert run.run_id.endswith(config_hash(resolved))


def test_no_fold_run_reaching_phase_2_gives_complete_runs_without_one(tmp_path):
    epochs = observed_epochs([_log(tmp_path / "a.csv", [1] * 40)])  # the epochs cap came first
    assert epochs["followup_epochs"] == 0
    _, complete = _split(final_runs(CONFIG, "reality", _search(CONFIG), BEST, epochs))
    for run in complete:
        f = resolve_run_config(run.config)["followup"]
        assert f["trigger"] == "epochs" and f["epochs"] == 0 and f["loss"] == {}


def test_epochs_trigger_fold_runs_that_all_stopped_before_phase_2_give_complete_runs_without_one(tmp_path):
    fixed = copy.deepcopy(CONFIG)
    fixed["methods"]["rsw"]["followup"] = {"epochs": 10, "lr": 1e-5, "loss": {"alpha": 24.68}}  # the last 10 of 40
    epochs = observed_epochs([_log(tmp_path / "a.csv", [1] * 12)])  # early-stopped at epoch 12, in phase 1
    _, complete = _split(final_runs(fixed, "reality", _search(fixed), BEST, epochs))
    assert complete
    for run in complete:
        f = resolve_run_config(run.config)["followup"]
        assert f["trigger"] == "epochs" and f["epochs"] == 0 and f["loss"] == {}


def test_a_phase_2_cap_is_replaced_by_the_observed_epochs():
    capped = copy.deepcopy(CONFIG)
    capped["methods"]["rsw"]["followup"]["epochs"] = 15
    search = _search(capped)
    assert search.config["followup"]["epochs"] == 15
    _, complete = _split(final_runs(capped, "reality", search, BEST, {"epochs": 25, "followup_epochs": 5}))
    for run in complete:
        f = resolve_run_config(run.config)["followup"]
        assert (f["trigger"], f["epochs"]) == ("epochs", 5)


def test_a_plateau_search_whose_complete_runs_cannot_resolve_fails_when_planned():
    bad = copy.deepcopy(CONFIG)
    bad["experiments"]["reality"]["final"]["complete"]["validation"] = {"split": None}  # keeps the patience
    with pytest.raises(ExperimentError, match=r"reality.final .*complete.*validation\.patience"):
        search_runs(bad)
