"""Shapes in a separate process (dmlrepro.preflight.worker): a shape past its time limit fails with
that reason, and the next shape gets a fresh process."""

import tempfile
from pathlib import Path

import pytest

from dmlrepro.preflight.sources import data_source
from dmlrepro.preflight.stepping import preflight_config
from dmlrepro.preflight.worker import ShapeWorker

pytestmark = pytest.mark.slow


def tiny(root: Path) -> dict:
    cfg = {
        "dataset": {
            "name": "synthetic",
            "image_size": 32,
            "resize": 32,
            "train_crop": "random",
            "batch_size": 8,
            "params": {"num_classes": 8, "images_per_class": 4, "size": 32},
        },
        "model": {"backbone": "tiny_cnn", "embedding_size": 8},
        "loss": {"name": "proxy_anchor"},
    }
    from dmlrepro.train.config import resolve_run_config

    cfg = resolve_run_config(cfg)
    return preflight_config(cfg, device="cpu", source=data_source(cfg["dataset"], root / "none", root))


def test_a_shape_past_its_time_limit_fails_and_the_next_gets_a_fresh_process():
    with tempfile.TemporaryDirectory() as scratch:
        cfg = tiny(Path(scratch))
        with ShapeWorker(timeout=0.001) as worker:
            late = worker.measure(cfg, 1)
            first = worker.process
            assert first is None  # stopped
            worker.timeout = 600
            ok = worker.measure(cfg, 1)
    assert late.status == "failed" and late.error.startswith("TimeoutError: no result within 0.001 s")
    assert ok.status == "ok" and ok.step_seconds > 0 and ok.batch_size == 8
