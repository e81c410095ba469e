"""The projection of a run's hours and its time budget (dmlrepro.preflight.projection), against
hand-computed values from the formula in docs/preflight.md#projection."""

import pytest

from dmlrepro.budget import RETRIES_ENV, TIME_LIMIT_ENV, warn_time_budget
from dmlrepro.preflight.projection import (
    RunCost,
    Speed,
    budget_hours,
    count_test_evaluations,
    job_budget_env,
    run_hours,
    steps_per_epoch,
    summarize,
)
from dmlrepro.preflight.sources import stand_in_counts
from dmlrepro.train.config import resolve_run_config

CUB = {"train_images": 5864, "test_images": 5924}  # CUB-200-2011's published split


def cub_run(**extra):
    return resolve_run_config(
        {"dataset": {"name": "cub200", "batch_size": 100}, "epochs": 200, "model": {"backbone": "tiny_cnn"}, **extra}
    )


def test_counts_are_the_published_ones_or_the_protocols():
    assert stand_in_counts({"name": "cub200"})["train_images"] == 5864
    assert stand_in_counts({"name": "sop"})["test_images"] == 60502
    # Multi-digit MNIST's protocol: 64 + 16 training and validation classes, 20 test classes (docs/data.md)
    counts = stand_in_counts({"name": "double_mnist", "params": {"images_per_class": 60}})
    assert (counts["train_images"], counts["test_images"]) == (80 * 60, 20 * 60)
    counts = stand_in_counts({"name": "triple_mnist", "params": {"images_per_class": 6}})
    assert (counts["train_images"], counts["test_images"]) == (800 * 6, 200 * 6)
    assert stand_in_counts({"name": "made_up"}) is None


def test_steps_and_evaluations():
    cfg = cub_run()
    assert steps_per_epoch(cfg, 5864) == 58  # 5864 // 100, drop_last
    assert count_test_evaluations(cfg) == 201  # row 0 + every epoch
    assert count_test_evaluations(cub_run(epochs=12, eval={"every": 5})) == 4  # row 0, epochs 5, 10 and the last (12)
    fold = cub_run(
        dataset={"name": "cub200", "batch_size": 32},
        validation={"split": "fold", "n_folds": 4},
        eval={"select": "best_val"},
    )
    assert steps_per_epoch(fold, 5864) == 4398 // 32  # three of four folds of the classes train
    assert count_test_evaluations(fold) == 2  # row 0, then the restored best model once
    assert steps_per_epoch(cub_run(steps_per_epoch=25), 5864) == 25


def test_hours_by_hand():
    cfg = cub_run()
    speed = Speed(
        step_seconds=0.5, batch_size=100, data_images_per_second=1000.0, eval_images_per_second=2000.0, workers=8
    )
    # 200 epochs × 58 steps × 0.5 s; 201 test evaluations × 5924 images at min(2000, 1000) images/s
    assert run_hours(cfg, CUB, speed) == pytest.approx((200 * 58 * 0.5 + 201 * 5924 / 1000) / 3600, rel=1e-12)
    # measured at batch 4: per image, 0.02 s × 100 = 2 s a step; without workers data time adds up
    small = Speed(step_seconds=0.08, batch_size=4, data_images_per_second=100.0, eval_images_per_second=50.0, workers=0)
    assert run_hours(cfg, CUB, small) == pytest.approx(
        (200 * 58 * (2.0 + 1.0) + 201 * 5924 * (1 / 50 + 1 / 100)) / 3600, rel=1e-12
    )


def test_budget_and_summary():
    config = {"resources": {"train": {"default": {"runtime": 60}, "sop": {"runtime": 480}}}}
    assert budget_hours(config, "cub200", retries=2) == 3.0
    assert budget_hours(config, "sop", retries=0) == 8.0
    assert budget_hours({}, "cub200", retries=0) == 1.0  # rule train's built-in 60 min
    costs = [RunCost("a", ["t1", "t2"], 2.0, 3.0), RunCost("b", ["t2"], 4.0, 3.0)]
    assert [c.over_budget for c in costs] == [False, True]
    experiments, total = summarize(costs, {"t1": ["a"], "t2": ["a", "b"]})
    assert [(e["name"], e["hours"]) for e in experiments] == [("t1", 2.0), ("t2", 6.0)]
    assert total == 6.0  # a shared run counts once in the total


def test_training_job_warns_after_its_first_full_epoch():
    cfg = cub_run(warmup_epochs=1)
    env = {TIME_LIMIT_ENV: "60", RETRIES_ENV: "2"}  # budget 3 h
    said = []
    assert warn_time_budget(cfg, 1, 60.0, said.append, env) is None  # the warm-up epoch (frozen trunk)
    assert warn_time_budget(cfg, 2, 50.0, said.append, env) is None  # 200 × 50 s = 2.78 h <= 3 h
    message = warn_time_budget(cfg, 2, 60.0, said.append, env)  # 200 × 60 s = 3.33 h > 3 h
    assert said == [message] and "3.33 h" in message and "cannot finish" in message
    assert warn_time_budget(cfg, 2, 600.0, said.append, {}) is None  # no limit known: a local run


def test_time_limit_reaches_only_slurm_jobs():
    assert job_budget_env(90, {"SLURM_JOB_ID": "12"}) == {TIME_LIMIT_ENV: "90"}
    assert job_budget_env(90, {}) == {}


def test_knn_seconds_by_hand():
    """Hours add queries × references × dimension × the measured rate per evaluation's search."""
    cfg = cub_run(model={"backbone": "tiny_cnn", "embedding_size": 64})
    speed = Speed(
        step_seconds=0.5, batch_size=100, data_images_per_second=1000.0, eval_images_per_second=2000.0, workers=8
    )
    rate = 1e-9  # seconds per query·reference·dimension
    base = run_hours(cfg, CUB, speed)
    assert run_hours(cfg, CUB, speed, rate) - base == pytest.approx(201 * 5924 * 5924 * 64 * rate / 3600, rel=1e-12)
    # a validation split searches its held-out classes after every epoch: 5864 / 4 = 1466 images
    fold = cub_run(
        model={"backbone": "tiny_cnn", "embedding_size": 64},
        validation={"split": "fold", "n_folds": 4},
        eval={"select": "best_val"},
    )
    extra = run_hours(fold, CUB, speed, rate) - run_hours(fold, CUB, speed)
    assert extra == pytest.approx((2 * 5924**2 + 200 * 1466**2) * 64 * rate / 3600, rel=1e-12)
    # In-Shop's query/gallery protocol: queries × gallery
    inshop = {"train_images": 25882, "query_images": 14218, "gallery_images": 12612}
    shop = resolve_run_config(
        {
            "dataset": {"name": "inshop", "batch_size": 100, "test_split": "query", "gallery_split": "gallery"},
            "epochs": 2,
            "model": {"backbone": "tiny_cnn", "embedding_size": 8},
        }
    )
    extra = run_hours(shop, inshop, speed, rate) - run_hours(shop, inshop, speed)
    assert extra == pytest.approx(3 * 14218 * 12612 * 8 * rate / 3600, rel=1e-12)


def test_kcenter_selections_by_hand():
    """ASAP: (1 + epochs // projection_patience) selections, each embedding C × pool images and timing
    the traversal for (C, pool, P, D)."""
    from dmlrepro.preflight.projection import kcenter_selections

    asap = dict(
        model={"backbone": "tiny_cnn", "embedding_size": 128},
        epochs=25,
        loss={"name": "asap_c1", "hparams": {"proxies_per_class": 8}},
        asap={"enabled": True, "b": 12, "projection_patience": 3},
        validation={"split": "fold", "n_folds": 4},
    )
    cfg = cub_run(**asap)
    assert kcenter_selections(cfg) == 1 + 25 // 3
    assert kcenter_selections(cub_run(**{**asap, "asap": {**asap["asap"], "max_alternations": 2}})) == 3
    assert kcenter_selections(cub_run()) == 0
    speed = Speed(
        step_seconds=0.5, batch_size=100, data_images_per_second=1000.0, eval_images_per_second=500.0, workers=8
    )
    calls = []

    def timer(classes, pool, p, dim):
        calls.append((classes, pool, p, dim))
        return 3.0

    extra = run_hours(cfg, CUB, speed, 0.0, timer, 100) - run_hours(cfg, CUB, speed)
    assert calls == [(100, 12, 8, 128)]  # b = 12 ≥ P = 8: a pool of b per class
    assert extra == pytest.approx(9 * (100 * 12 / 500 + 3.0) / 3600, rel=1e-12)
    assert run_hours(cub_run(), CUB, speed, 0.0, timer, 100) == run_hours(cub_run(), CUB, speed)  # no ASAP


def test_knn_and_kcenter_are_measured():
    from dmlrepro.preflight.projection import measure_kcenter, measure_knn

    assert 0 < measure_knn(16, 4, "cpu", queries=128, references=256) < 1e-3
    assert measure_kcenter(64, 12, 4, 16, "cpu") > 0
