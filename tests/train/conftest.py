"""Shared fixtures: the embedded `digits` dataset prepared once per session, and a tiny run config."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    from dmlrepro.data import prepare

    root = tmp_path_factory.mktemp("train-data")
    prepare("digits", root, progress=False)
    return root


#: the generated dataset of the validation / ASAP / followup-plateau tests: 32 classes (16 train, 4 folds of 4)
SYNTH = {"num_classes": 32, "images_per_class": 12, "size": 32}


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory) -> Path:
    from dmlrepro.data import prepare

    root = tmp_path_factory.mktemp("synth-data")
    prepare("synthetic", root, progress=False, **SYNTH)
    return root


def tiny_config(root: Path, **overrides) -> dict:
    """A run of a few seconds: digits at 32 px, a 3-layer CNN, 3 epochs x 4 steps of 32 images."""
    cfg = {
        "dataset": {
            "name": "digits",
            "root": str(root),
            "image_size": 32,
            "resize": 32,
            "train_crop": "random",
            "batch_size": 32,
            "eval_batch_size": 512,
        },
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [16, 32, 32], "strides": [2, 2, 2]},
            "embedding_size": 16,
        },
        "loss": {"name": "pfml", "hparams": {"proxies_per_class": 2}},
        "optimizer": {"name": "adam", "lr": 1e-3, "lr_mult": {"loss": 100}},
        "epochs": 3,
        "steps_per_epoch": 4,
        "seed": 3,
        "threads": 1,
        "device": "cpu",  # CPU-exact values; the CUDA lane (tests/cuda) runs its own copies on the GPU
    }
    return with_overrides(cfg, overrides)


def with_overrides(cfg: dict, overrides: dict) -> dict:
    """`cfg` with each `section__key=value` of `overrides` set (nested keys joined by `__`)."""
    for key, value in overrides.items():
        node = cfg
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = copy.deepcopy(value)
    return cfg


@pytest.fixture
def tiny(data_root):
    return lambda **overrides: tiny_config(data_root, **overrides)


def run_cli(
    args: list[str], env_extra: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m dmlrepro.train.cli ARGS`` in a fresh process (1 thread)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env_extra or {})}
    for k in (
        "DMLREPRO_TEST_KILL_AFTER_STEPS",
        "DMLREPRO_TEST_SIGNAL_AFTER_STEPS",
        "DMLREPRO_TEST_KILL_IN_CHECKPOINT",
        "DMLREPRO_TEST_SIGNAL",
    ):
        if k not in (env_extra or {}):
            env.pop(k, None)
    return subprocess.run(
        [sys.executable, "-m", "dmlrepro.train.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
