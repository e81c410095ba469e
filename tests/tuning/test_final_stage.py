"""The final stage after a search (RSW App. D): tuning.final.final_runs, tuning.searches.method_search_spec,
tuning.observed_epochs, and tuning.final.FinalStage, the workflow's run table growing with the final
stages while it plans (the fold runs once a search's best point is known, the Complete runs once
their epochs are)."""

import copy

import pytest

from dmlrepro.runs import ExperimentError, experiment_runs, resolve_runs
from dmlrepro.tuning import observed_epochs
from dmlrepro.tuning.final import COMPLETE_KEY, FinalStage, final_runs
from dmlrepro.tuning.searches import search_runs

CONFIG = {
    "defaults": {
        "epochs": 4,
        "model": {"backbone": "tiny_cnn", "embedding_size": 16},
        "validation": {"split": "fold", "n_folds": 4, "scheme": "mlrc"},
    },
    "datasets": {"synthetic": {"dataset": {"name": "synthetic"}}},
    "methods": {
        "pfml": {"loss": {"name": "pfml", "hparams": {"alpha": 4.0}}},
        "rsw": {"loss": {"name": "rsw"}, "followup": {"epochs": 2, "lr": 1e-5}},
    },
    "experiments": {
        "reality": {
            "methods": ["pfml", "rsw"],
            "datasets": ["synthetic"],
            "search": {
                "space": {"optimizer.lr": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True}},
                "method_space": {
                    "pfml": {"loss.hparams.alpha": {"type": "float", "low": 1.0, "high": 8.0}},
                    "rsw": {"loss.hparams.alpha": {"type": "float", "low": 1.0, "high": 50.0}},
                },
                "trials": 3,
                "folds": [0, 1, 2, 3],
            },
            "final": {"seeds": [0, 1, 2], "complete": {"model": {"embedding_size": 64}, "validation": {"split": None}}},
            "metrics": ["map@r@separated"],
        }
    },
}


def _search(config, method):
    (search,) = [s for s in search_runs(config).values() if s.method == method]
    return search


def test_fold_runs_are_every_seed_times_every_search_fold_with_the_best_point():
    search = _search(CONFIG, "pfml")
    runs = final_runs(CONFIG, "reality", search, {"optimizer.lr": 3e-4, "loss.hparams.alpha": 6.5})
    assert len(runs) == 3 * 4
    points = sorted((r.seed, r.experiments["reality"]["validation.fold"]) for r in runs.values())
    assert points == [(seed, fold) for seed in range(3) for fold in range(4)]
    for run in runs.values():
        assert run.config["optimizer"]["lr"] == 3e-4 and run.config["loss"]["hparams"]["alpha"] == 6.5
        assert run.config["validation"]["fold"] == run.experiments["reality"]["validation.fold"]
        assert run.config["model"]["embedding_size"] == 16
    # the run table's order: seed by seed, fold by fold
    assert [(r.seed, r.experiments["reality"]["validation.fold"]) for r in experiment_runs(runs, "reality")] == points


def test_complete_runs_take_the_overrides_and_the_observed_epochs_per_phase():
    best = {"optimizer.lr": 3e-4, "loss.hparams.alpha": 20.0}
    epochs = {"epochs": 10, "followup_epochs": 5}
    rsw = final_runs(CONFIG, "reality", _search(CONFIG, "rsw"), best, epochs)
    complete = [r for r in rsw.values() if r.experiments["reality"].get(COMPLETE_KEY)]
    assert sorted(r.seed for r in complete) == [0, 1, 2] and len(rsw) == 3 * 5
    for run in complete:
        assert run.config["model"]["embedding_size"] == 64 and run.config["validation"]["split"] is None
        assert run.config["epochs"] == 10 and run.config["followup"]["epochs"] == 5
        assert run.config["loss"]["hparams"]["alpha"] == 20.0
    # a method without a followup phase gets the total only
    pfml = final_runs(CONFIG, "reality", _search(CONFIG, "pfml"), best, epochs)
    (run, *_) = [r for r in pfml.values() if r.experiments["reality"].get(COMPLETE_KEY)]
    assert run.config["epochs"] == 10 and run.config["followup"]["epochs"] == 0
    # without the epochs (the fold runs have not trained yet) there is no Complete run
    assert len(final_runs(CONFIG, "reality", _search(CONFIG, "pfml"), best)) == 12


def test_each_method_searches_its_own_space_and_editing_it_leaves_the_others_alone():
    before = search_runs(CONFIG)
    changed = copy.deepcopy(CONFIG)
    changed["experiments"]["reality"]["search"]["method_space"]["rsw"]["loss.hparams.alpha"]["high"] = 40.0
    after = search_runs(changed)
    assert {before[s].method for s in set(before) - set(after)} == {"rsw"}
    assert {before[s].method for s in set(before) & set(after)} == {"pfml"}


def test_a_bad_method_space_names_the_method_and_final_needs_a_search():
    bad = copy.deepcopy(CONFIG)
    bad["experiments"]["reality"]["search"]["method_space"]["rsw"] = {"loss.hparams.alpha": {"type": "float"}}
    with pytest.raises(ExperimentError, match=r"search.space \(method rsw\)"):
        search_runs(bad)
    bad = copy.deepcopy(CONFIG)
    del bad["experiments"]["reality"]["search"]
    with pytest.raises(ExperimentError, match="reality.final: .* has no search"):
        search_runs(bad)


def _log(path, phases):
    rows = ["epoch,phase,loss", "0,1,"] + [f"{i},{p},0.5" for i, p in enumerate(phases, start=1)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_observed_epochs_are_the_fold_means_rounded_up_per_phase(tmp_path):
    logs = [_log(tmp_path / "a.csv", [1] * 9 + [2] * 3), _log(tmp_path / "b.csv", [1] * 12 + [2] * 4)]
    out = observed_epochs(logs)  # totals 12, 16 -> mean 14 -> 15; followup 3, 4 -> 3.5 -> 5
    assert out == {"epochs": 15, "followup_epochs": 5, "observed": {"epochs": [12, 16], "followup_epochs": [3, 4]}}
    assert observed_epochs(logs, multiple=1)["epochs"] == 14
    assert observed_epochs(logs, multiple=1)["followup_epochs"] == 4  # 3.5 rounds up
    # one phase only: no followup; at least one multiple; and the total always exceeds the followup
    assert observed_epochs([_log(tmp_path / "c.csv", [1, 1])]) == {
        "epochs": 5,
        "followup_epochs": 0,
        "observed": {"epochs": [2], "followup_epochs": [0]},
    }
    assert observed_epochs([_log(tmp_path / "d.csv", [2] * 5)])["epochs"] == 10
    with pytest.raises(ValueError, match="no train logs"):
        observed_epochs([])


def test_a_bad_final_stage_fails_when_the_searches_are_planned():
    bad = copy.deepcopy(CONFIG)
    bad["defaults"]["validation"]["patience"] = 5  # the Complete runs drop the split but keep the patience
    with pytest.raises(ExperimentError, match=r"reality.final .*complete.*validation.patience"):
        search_runs(bad)


STAGE_BEST = {"params": {"optimizer.lr": 3e-4, "loss.hparams.alpha": 6.5}}
EPOCHS = {"epochs": 10, "followup_epochs": 5}


def _stage(config=CONFIG):
    runs, searches = resolve_runs(config), search_runs(config)
    return FinalStage(config, runs, searches), runs, searches


def test_nothing_is_planned_before_a_search_has_its_best_point():
    stage, runs, _ = _stage()
    asked = []
    assert stage.experiment_runs("reality", best=lambda s: None, epochs=lambda s: asked.append(s)) == {}
    assert runs == {} and asked == []


def test_fold_runs_first_then_the_complete_runs_each_registered_once():
    stage, runs, searches = _stage()
    asked = []
    found = stage.experiment_runs("reality", best=lambda s: STAGE_BEST, epochs=lambda s: asked.append(s.run_id))
    assert sorted(asked) == sorted(searches)  # epochs asked per search, unknown yet: fold runs only
    assert len(found) == 2 * 3 * 4 and set(runs) == set(found)
    assert not any(r.experiments["reality"].get(COMPLETE_KEY) for r in runs.values())
    found = stage.experiment_runs("reality", best=lambda s: STAGE_BEST, epochs=lambda s: EPOCHS)
    assert len(found) == 2 * 3 * 5 and set(runs) == set(found)
    expected = {}
    for search in searches.values():
        expected.update(final_runs(CONFIG, "reality", search, STAGE_BEST["params"], EPOCHS))
    assert {i: r.config for i, r in runs.items()} == {i: r.config for i, r in expected.items()}


def test_fold_runs_of_one_search_and_a_run_shared_with_another_experiment():
    config = copy.deepcopy(CONFIG)
    config["experiments"]["reality"]["final"].pop("complete")
    stage, runs, searches = _stage(config)
    search_id = next(iter(searches))
    found = stage.fold_runs("reality", search_id, STAGE_BEST)
    assert set(found) == set(final_runs(config, "reality", searches[search_id], STAGE_BEST["params"])) == set(runs)
    # the same runs from a second experiment: one run each, in both experiments
    other = {i: copy.deepcopy(r) for i, r in found.items()}
    for run in other.values():
        run.experiments, run.position = {"again": {}}, {"again": 7}
    stage.register(other)
    assert set(runs) == set(found)
    assert all(set(r.experiments) == {"reality", "again"} and r.position["again"] == 7 for r in runs.values())


def test_an_experiment_without_a_final_stage_has_no_final_runs():
    config = copy.deepcopy(CONFIG)
    config["experiments"]["reality"].pop("final")
    stage, runs, _ = _stage(config)
    assert stage.experiment_runs("reality", best=lambda s: STAGE_BEST, epochs=lambda s: EPOCHS) == {} and runs == {}
