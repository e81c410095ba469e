"""Run shapes (dmlrepro.preflight.shapes): which config differences make a new shape."""

import copy

import yaml

from dmlrepro.preflight.shapes import group_runs, shape_key
from dmlrepro.train.config import resolve_run_config

BASE = {
    "dataset": {"name": "cub200", "batch_size": 32, "image_size": 224},
    "model": {"backbone": "resnet50", "embedding_size": 512},
    "loss": {"name": "pfml", "hparams": {"proxies_per_class": 15, "alpha": 4.0, "delta": 0.2}},
    "optimizer": {"lr": 1e-4},
    "epochs": 200,
    "seed": 0,
}


def key(**changes):
    partial = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = partial
        *parents, last = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return shape_key(resolve_run_config(partial))


def test_values_do_not_make_shapes():
    same = key()
    assert key(seed=3) == same
    assert key(optimizer__lr=5e-4) == same
    assert key(epochs=40) == same
    assert key(loss__hparams={"proxies_per_class": 15, "alpha": 2.0, "delta": 0.3}) == same
    assert key(loss__hparams={"proxies_per_class": 5, "alpha": 4.0, "delta": 0.2}) == same  # a count, not a key
    assert key(dataset__name="cars196") == same  # 98 training classes: the same order of magnitude as CUB's 100
    assert key(num_workers=4, threads=2) == same  # runtime keys


def test_structure_makes_shapes():
    same = key()
    assert key(dataset__batch_size=64) != same
    assert key(dataset__image_size=227) != same
    assert key(model__backbone="bn_inception") != same
    assert key(model__embedding_size=64) != same
    assert key(loss__name="proxy_anchor", loss__hparams={}) != same
    assert key(loss__hparams={"proxies_per_class": 15, "alpha": 4.0, "delta": 0.2, "alpha0_mode": "linear"}) != same
    assert key(dataset__name="sop") != same  # 11,318 classes: other proxy tensors
    assert key(amp={"enabled": True}) != same
    assert key(warmup_epochs=1) != same


def test_group_runs_one_representative_per_shape_and_bad_experiments_alone():
    config = yaml.safe_load("""
data_root: data
results: results
defaults: {model: {backbone: tiny_cnn, embedding_size: 16}, dataset: {image_size: 32, batch_size: 16}, epochs: 2}
datasets: {synthetic: {dataset: {name: synthetic}}}
methods:
  pfml: {loss: {name: pfml, hparams: {proxies_per_class: 2}}}
  pa: {loss: {name: proxy_anchor}}
  broken: {loss: {name: pfml, hparams: {proxies_per_class: 2, delta: -1.0}}}  # PFMLLoss refuses it
experiments:
  a: {methods: [pfml, pa], datasets: [synthetic], seeds: [0, 1, 2], sweep: {optimizer.lr: [0.001, 0.01]}}
  b: {methods: [pfml], datasets: [synthetic], seeds: [0, 7]}
  c: {methods: [broken], datasets: [synthetic]}
""")
    shapes, unresolved, members = group_runs(config)
    assert sorted(len(s.runs) for s in shapes) == [6, 8]  # pa: 3 seeds × 2 lrs; pfml: those + 2 of b
    assert sorted(members) == ["a", "b"] and len(members["a"]) == 12 and len(members["b"]) == 2
    assert [u.name for u in unresolved] == ["c"]
    assert "delta" in unresolved[0].error and "experiments.c" in unresolved[0].error


def test_search_experiments_bring_their_final_stage():
    """A search experiment's runs: its searches and, after each, the final stage's fold and Complete runs
    (RSW App. D): seeds × (folds + 1) per search, with the Complete runs' own shape (embedding 64)."""
    config = {
        "data_root": "data",
        "results": "results",
        "defaults": {
            "epochs": 4,
            "model": {"backbone": "tiny_cnn", "embedding_size": 16},
            "validation": {"split": "fold", "n_folds": 4, "scheme": "mlrc"},
        },
        "datasets": {"synthetic": {"dataset": {"name": "synthetic"}}},
        "methods": {"pfml": {"loss": {"name": "pfml", "hparams": {"alpha": 4.0}}}},
        "experiments": {
            "reality": {
                "methods": ["pfml"],
                "datasets": ["synthetic"],
                "search": {
                    "space": {"optimizer.lr": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True}},
                    "trials": 3,
                    "folds": [0, 1, 2, 3],
                },
                "final": {
                    "seeds": [0, 1, 2],
                    "complete": {"model": {"embedding_size": 64}, "validation": {"split": None}},
                },
                "metrics": ["map@r@separated"],
            }
        },
    }
    shapes, unresolved, members = group_runs(config)
    assert unresolved == [] and len(members["reality"]) == 1 + 3 * (4 + 1)
    finals = {run_id for shape in shapes for run_id in shape.finals}
    searches = {run_id for shape in shapes for run_id in shape.searches}
    assert len(finals) == 15 and len(searches) == 1 and not finals & searches
    complete = [run for shape in shapes for run in shape.runs if run.experiments["reality"].get("complete")]
    assert len(complete) == 3 and all(run.config["model"]["embedding_size"] == 64 for run in complete)
    config["experiments"]["reality"].pop("final")
    assert len(group_runs(config)[2]["reality"]) == 1  # no final stage: the search alone
