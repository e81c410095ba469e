"""The preflight's evaluation measurement (dmlrepro.preflight.stepping.measure_evaluation): the
engine's embedding loop over one in-memory batch of the run's `dataset.eval_batch_size` (a test
split smaller than that repeated), one untimed pass first, the metrics timed apart."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from dmlrepro.preflight import stepping
from dmlrepro.preflight.sources import data_source
from dmlrepro.train.config import resolve_run_config

EVAL_BATCH = 24  # the synthetic test split below has 16 images: the batch repeats them


@pytest.fixture
def trainer(tmp_path: Path):
    cfg = resolve_run_config(
        {
            "dataset": {
                "name": "synthetic",
                "image_size": 32,
                "resize": 32,
                "train_crop": "random",
                "batch_size": 8,
                "eval_batch_size": EVAL_BATCH,
                "params": {"num_classes": 8, "images_per_class": 4, "size": 32},
            },
            "model": {"backbone": "tiny_cnn", "embedding_size": 8},
            "loss": {"name": "proxy_anchor"},
            "num_workers": 0,
            "threads": 1,
        }
    )
    cfg = stepping.preflight_config(cfg, device="cpu", source=data_source(cfg["dataset"], tmp_path / "none", tmp_path))
    with stepping.engine_process({**cfg, "device": "cpu"}) as run_cfg:
        built, _ = stepping.build_trainer(run_cfg, tmp_path / "run")
        yield built
        built.parts.close()


def test_the_batch_has_the_run_s_evaluation_size_the_split_repeated(trainer):
    x, y, distinct = stepping.eval_batch(trainer)
    ds = trainer.parts.test_ds
    assert distinct == len(ds) == 16 and x.shape[0] == y.shape[0] == EVAL_BATCH
    items = torch.stack([ds[i][0] for i in range(distinct)])
    assert torch.equal(x[:distinct], items) and torch.equal(x[distinct:], items[: EVAL_BATCH - distinct])
    assert y.tolist() == [int(ds.labels[k % distinct]) for k in range(EVAL_BATCH)]


def test_the_loop_is_timed_after_a_warm_up_and_the_metrics_apart(trainer, monkeypatch):
    now = [0.0]

    def clock() -> float:  # one second per reading, plus what a pass and the metrics "take"
        now[0] += 1.0
        return now[0]

    passes, metric_rows = [], []
    embed, metrics = stepping.embed_batches, stepping.embedding_metrics

    def recorded_embed(model, batches, device, **kwargs):
        passes.append([len(x) for x, _ in batches])
        now[0] += 10.0
        return embed(model, batches, device, **kwargs)

    def slow_metrics(emb, labels, cfg, gallery=None):
        metric_rows.append((len(emb), len(labels)))
        now[0] += 100.0
        return metrics(emb, labels, cfg, gallery)

    monkeypatch.setattr(stepping, "time", types.SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(stepping, "embed_batches", recorded_embed)
    monkeypatch.setattr(stepping, "embedding_metrics", slow_metrics)
    images_per_second, metric_seconds = stepping.measure_evaluation(trainer)
    assert passes == [[EVAL_BATCH], [EVAL_BATCH]]  # the untimed pass, then the timed one, in memory
    assert images_per_second == EVAL_BATCH / 11.0  # one pass and one reading: no loader, warm-up or metrics
    assert metric_seconds == 101.0
    assert metric_rows == [(16, 16)]  # the metrics see the split's distinct images once


def test_a_gallery_split_is_searched_against_the_gallery_images_of_the_queries_classes(tmp_path, monkeypatch):
    cfg = resolve_run_config(
        {
            "dataset": {
                "name": "inshop",
                "test_split": "query",
                "gallery_split": "gallery",
                "image_size": 32,
                "resize": 32,
                "train_crop": "random",
                "batch_size": 8,
                "eval_batch_size": EVAL_BATCH,
            },
            "model": {"backbone": "tiny_cnn", "embedding_size": 8, "pretrained": False},
            "loss": {"name": "proxy_anchor"},
            "num_workers": 0,
            "threads": 1,
        }
    )
    cfg = stepping.preflight_config(cfg, device="cpu", source=data_source(cfg["dataset"], tmp_path / "none", tmp_path))
    seen = []
    metrics = stepping.embedding_metrics

    def recorded(emb, labels, run_cfg, gallery=None):
        seen.append((len(emb), set(labels.tolist()), None if gallery is None else set(gallery[1].tolist())))
        return metrics(emb, labels, run_cfg, gallery)

    monkeypatch.setattr(stepping, "embedding_metrics", recorded)
    with stepping.engine_process({**cfg, "device": "cpu"}) as run_cfg:
        trainer, _ = stepping.build_trainer(run_cfg, tmp_path / "run")
        try:
            images_per_second, metric_seconds = stepping.measure_evaluation(trainer)
        finally:
            trainer.parts.close()
    assert images_per_second > 0 and metric_seconds > 0
    [(queries, query_classes, gallery_classes)] = seen
    assert len(trainer.parts.test_ds) == 32 and queries == EVAL_BATCH  # the split's first evaluation batch
    assert gallery_classes == query_classes
