"""Experiments resolve into content-addressed runs (docs/workflow.md)."""

import copy

import pytest
import yaml

from dmlrepro.runs import ExperimentError, experiment_runs, resolve_runs

BASE = {
    "data_root": "data",
    "results": "results",
    "defaults": {"epochs": 1, "model": {"backbone": "tiny_cnn"}},
    "datasets": {"synthetic": {"dataset": {"name": "synthetic"}}, "digits": {"dataset": {"name": "digits"}}},
    "methods": {
        "pfml": {"loss": {"name": "pfml", "hparams": {"alpha": 4.0}}},
        "proxy_anchor": {"loss": {"name": "proxy_anchor"}},
    },
    "experiments": {
        "table": {
            "methods": ["pfml", "proxy_anchor"],
            "datasets": ["synthetic", "digits"],
            "seeds": [0, 1],
            "metrics": ["recall@1"],
        },
        "alpha": {
            "methods": ["pfml"],
            "datasets": ["synthetic"],
            "seeds": [0],
            "sweep": {"loss.hparams.alpha": [2.0, 4.0]},
            "metrics": ["recall@1"],
        },
    },
}


def test_product_of_methods_datasets_seeds_and_sweep():
    runs = resolve_runs(BASE)
    assert len(experiment_runs(runs, "table")) == 2 * 2 * 2
    alpha = experiment_runs(runs, "alpha")
    assert sorted(r.config["loss"]["hparams"]["alpha"] for r in alpha) == [2.0, 4.0]
    assert len(runs) == 8 + 1  # the alpha = 4 point is table's pfml/synthetic/seed 0 run


def test_shared_run_knows_each_experiments_sweep_point():
    runs = resolve_runs(BASE)
    shared = [r for r in runs.values() if len(r.experiments) == 2]
    assert len(shared) == 1
    assert shared[0].experiments == {"table": {}, "alpha": {"loss.hparams.alpha": 4.0}}


def test_changing_one_hyperparameter_changes_only_the_runs_it_touches():
    before = resolve_runs(BASE)
    changed = copy.deepcopy(BASE)
    changed["methods"]["proxy_anchor"]["loss"]["hparams"] = {"margin": 0.2}
    after = resolve_runs(changed)
    kept = set(before) & set(after)
    assert {before[r].method for r in set(before) - kept} == {"proxy_anchor"}
    assert all(before[r].method == "pfml" for r in kept) and len(kept) == 5


def test_locations_do_not_change_run_ids():
    moved = copy.deepcopy(BASE)
    moved["defaults"] = {**moved["defaults"], "dataset": {"root": "/scratch/data"}, "num_workers": 8, "device": "cpu"}
    assert set(resolve_runs(moved)) == set(resolve_runs(BASE))


def test_run_id_is_readable_and_stable():
    runs = resolve_runs(BASE, ["alpha"])
    assert all(r.startswith("pfml-synthetic-tiny_cnn-s0-") for r in runs)
    assert list(runs) == list(resolve_runs(yaml.safe_load(yaml.safe_dump(BASE)), ["alpha"]))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c["experiments"]["table"]["methods"].append("pfmll"), "unknown method 'pfmll'"),
        (lambda c: c["experiments"]["table"]["datasets"].append("cub"), "unknown dataset 'cub'"),
        (lambda c: c["experiments"]["alpha"].update(sweep={"optimizer.lr": [-1.0]}), "optimizer.lr"),
    ],
)
def test_bad_experiments_name_the_key(edit, message):
    config = copy.deepcopy(BASE)
    edit(config)
    with pytest.raises(ExperimentError, match=message):
        resolve_runs(config)


def test_one_dataset_name_cannot_have_two_preparations():
    from dmlrepro.runs import dataset_parameters

    config = copy.deepcopy(BASE)
    config["methods"]["pfml"]["dataset"] = {"params": {"num_classes": 8}}
    with pytest.raises(ExperimentError, match="different dataset.params"):
        dataset_parameters(resolve_runs(config))
    assert dataset_parameters(resolve_runs(BASE)) == {"synthetic": {}, "digits": {}}


def test_canonical_order_does_not_depend_on_the_config_file():
    from dmlrepro.nested import canonical

    assert repr(canonical({"b": 1, "a": {"d": [{"y": 1, "x": 2}], "c": 3}})) == repr(
        canonical({"a": {"c": 3, "d": [{"x": 2, "y": 1}]}, "b": 1})
    )


def test_experiment_order_in_the_file_does_not_reorder_an_experiments_runs():
    flipped = copy.deepcopy(BASE)
    flipped["experiments"] = dict(reversed(list(BASE["experiments"].items())))
    for name in BASE["experiments"]:
        assert [r.run_id for r in experiment_runs(resolve_runs(BASE), name)] == [
            r.run_id for r in experiment_runs(resolve_runs(flipped), name)
        ]


def test_per_dataset_method_values_apply_on_their_dataset_only_and_before_overrides():
    config = copy.deepcopy(BASE)
    config["methods"]["pfml"]["per_dataset"] = {"digits": {"loss": {"hparams": {"alpha": 2.0}}}}
    runs = resolve_runs(config)
    alphas = {
        (r.dataset, r.seed): r.config["loss"]["hparams"]["alpha"]
        for r in experiment_runs(runs, "table")
        if r.method == "pfml"
    }
    assert alphas == {("synthetic", 0): 4.0, ("synthetic", 1): 4.0, ("digits", 0): 2.0, ("digits", 1): 2.0}
    unchanged = {r.run_id for r in resolve_runs(BASE).values() if r.dataset == "synthetic"}
    assert unchanged <= set(runs)  # the synthetic runs keep their ids
    config["experiments"]["table"]["overrides"] = {"loss": {"hparams": {"alpha": 6.0}}}
    overridden = experiment_runs(resolve_runs(config), "table")
    assert {r.config["loss"]["hparams"]["alpha"] for r in overridden if r.method == "pfml"} == {6.0}


def test_method_overrides_apply_to_their_method_after_the_overrides():
    config = copy.deepcopy(BASE)
    table = config["experiments"]["table"]
    table["overrides"] = {"epochs": 3, "loss": {"hparams": {"alpha": 6.0}}}
    table["method_overrides"] = {"pfml": {"loss": {"hparams": {"alpha": 8.0}}}}
    runs = experiment_runs(resolve_runs(config), "table")
    assert {r.config["loss"]["hparams"]["alpha"] for r in runs if r.method == "pfml"} == {8.0}
    assert all(r.config["epochs"] == 3 for r in runs)
    assert {r.config["loss"]["hparams"]["alpha"] for r in runs if r.method == "proxy_anchor"} == {6.0}
    # moving a method's values from overrides into method_overrides keeps its run ids
    moved = copy.deepcopy(BASE)
    moved["experiments"]["table"]["method_overrides"] = {"pfml": {"loss": {"hparams": {"alpha": 4.0}}}}
    assert set(resolve_runs(moved)) == set(resolve_runs(BASE))
    table["method_overrides"] = {"triplet": {"epochs": 2}}
    with pytest.raises(ExperimentError, match="method_overrides: 'triplet' is not one of its methods"):
        resolve_runs(config)


def test_search_experiments_and_opt_in():
    """An experiment with `search:` gives searches (search_runs), not runs; its id is the base run's id plus
    a hash of the search spec; `opt_in: true` experiments are left out unless the top-level opt_in names them."""
    import pytest

    from dmlrepro.runs import ExperimentError, active_experiments, resolve_runs
    from dmlrepro.tuning.searches import search_runs

    space = {"optimizer.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}
    base = {
        "defaults": {"validation": {"split": "holdout"}},
        "datasets": {"digits": {"dataset": {"name": "digits"}}},
        "methods": {"pa": {"loss": {"name": "proxy_anchor"}}},
        "experiments": {
            "table": {"methods": ["pa"], "datasets": ["digits"], "metrics": []},
            "tune": {"methods": ["pa"], "datasets": ["digits"], "metrics": [], "search": {"space": space, "trials": 3}},
            "costly": {
                "opt_in": True,
                "methods": ["pa"],
                "datasets": ["digits"],
                "metrics": [],
                "overrides": {"epochs": 7},
            },
        },
    }
    runs, searches = resolve_runs(base), search_runs(base)
    assert [r.experiments for r in runs.values()] == [{"table": {}}]
    ((search_id, search),) = searches.items()
    (run_id,) = runs
    assert search_id.startswith(run_id + "-") and search.config == runs[run_id].config
    other = search_runs(
        {**base, "experiments": {"tune": {**base["experiments"]["tune"], "search": {"space": space, "trials": 4}}}}
    )
    assert list(other) != [search_id]  # another spec, another search
    assert active_experiments(base) == ["table", "tune"]
    assert active_experiments({**base, "opt_in": ["costly"]}) == ["table", "tune", "costly"]
    assert len(resolve_runs({**base, "opt_in": ["costly"]})) == 2
    with pytest.raises(ExperimentError, match="opt_in: 'table'"):
        active_experiments({**base, "opt_in": ["table"]})
    # a group: `opt_in: <name>` experiments are chosen by the group's name or their own
    arm = {"methods": ["pa"], "datasets": ["digits"], "metrics": [], "opt_in": "arms"}
    grouped = {
        **base,
        "experiments": {
            **base["experiments"],
            "arm_a": {**arm, "overrides": {"epochs": 3}},
            "arm_b": {**arm, "overrides": {"epochs": 4}},
        },
    }
    assert active_experiments(grouped) == ["table", "tune"]
    assert active_experiments({**grouped, "opt_in": ["arms"]}) == ["table", "tune", "arm_a", "arm_b"]
    assert active_experiments({**grouped, "opt_in": ["arm_b", "costly"]}) == ["table", "tune", "costly", "arm_b"]
    with pytest.raises(ExperimentError, match="the groups \\['arms'\\]"):
        active_experiments({**grouped, "opt_in": ["arm"]})
    bad = {
        **base,
        "experiments": {
            "tune": {**base["experiments"]["tune"], "search": {"space": {"x": {"type": "nope"}}, "trials": 1}}
        },
    }
    with pytest.raises(ExperimentError, match="search.space"):
        search_runs(bad)


def test_train_request_merges_dataset_over_default_over_the_built_ins():
    """docs/workflow.md: resources.train.<dataset> over resources.train.default over the built-in
    requests (60 min, 4000 MB, no GPU, 1 CPU); a search job runs trials × folds runs in one job."""
    from dmlrepro.job_requests import check_train_requests, slurm_signal, train_request

    config = {
        "datasets": {"cub200": {}, "sop": {}},
        "resources": {"train": {"default": {"runtime": 120, "gpu": 1}, "sop": {"runtime": 480, "mem_mb": 9000}}},
    }
    assert train_request({"datasets": {}}, "cub200") == {"runtime": 60, "mem_mb": 4000, "gpu": 0, "cpus": 1}
    assert train_request(config, "cub200") == {"runtime": 120, "mem_mb": 4000, "gpu": 1, "cpus": 1}
    assert train_request(config, "sop") == {"runtime": 480, "mem_mb": 9000, "gpu": 1, "cpus": 1}
    assert train_request(config, "sop", {"trials": 3, "folds": [0, 1]})["runtime"] == 480 * 6
    assert train_request(config, "sop", {"trials": 3, "folds": None})["runtime"] == 480 * 3
    # SIGTERM min(300 s, 15 s per minute) before the limit; 0 = none; never at or past the limit
    assert slurm_signal({"runtime": 120}, "cub200") == "--signal=TERM@300"
    assert slurm_signal({"runtime": 10}, "cub200") == "--signal=TERM@150"
    assert slurm_signal({"runtime": 10, "warning": 0}, "cub200") == ""
    with pytest.raises(ValueError, match=r"resources.train \(cub200\): warning = 600 s"):
        slurm_signal({"runtime": 10, "warning": 600}, "cub200")
    check_train_requests(config)
    with pytest.raises(ValueError, match="resources.train.cars: expected 'default' or a key of datasets"):
        check_train_requests({**config, "resources": {"train": {"cars": {"runtime": 5}}}})


def test_train_priority_rises_with_the_images_a_run_trains_on():
    """The longest runs start first: images = epochs × steps × batch (× a search's runs); every training
    priority below the small jobs' (5) and the stand-in's (10), docs/workflow.md#scheduling."""
    from dmlrepro.job_requests import train_priority
    from dmlrepro.preflight.projection import planned_images

    asap = {
        "dataset": {"batch_size": 32, "sampler": "m_per_class"},
        "epochs": 400,
        "steps_per_epoch": 25,
    }  # E = 25 steps, 400 evaluations
    pfml = {
        "dataset": {"batch_size": 64, "sampler": "m_per_class"},
        "epochs": 80,
        "steps_per_epoch": None,
    }  # whole epochs of 1,536 images
    assert planned_images(asap, 1536) == 400 * 25 * 32
    assert planned_images(pfml, 1536) == 80 * 24 * 64
    assert planned_images(pfml, 1536, runs=6) == 6 * 80 * 24 * 64
    assert planned_images({**pfml, "epochs": 1}, 10) == 64  # one batch at least
    sizes = [0, 64, 10_000, 122_880, 320_000, 10**9]
    priorities = [train_priority(n) for n in sizes]
    assert priorities == sorted(priorities) and len(set(priorities)) == len(sizes)
    assert 0 <= priorities[0] and priorities[-1] < 5


def test_training_images_are_known_before_preparing(tmp_path):
    """The scheduler's estimate equals what preparing gives (synthetic: half the classes train)."""
    from dmlrepro.data.registry import expected_train_images, load, prepare

    params = {"num_classes": 6, "images_per_class": 3, "size": 16}
    prepare("synthetic", tmp_path, progress=False, **params)
    assert expected_train_images("synthetic", params) == load("synthetic", tmp_path).counts()["train_images"] == 9
    assert expected_train_images("synthetic", {"images_per_class": 24}) == 64 * 24  # 128 classes by default
    assert expected_train_images("sop") == 59551  # SOP's published split (Ebay_train.txt)
    with pytest.raises(KeyError, match="unknown dataset"):
        expected_train_images("imagenet")
