"""Fixtures of the fault-injection tests: the digits data, the fork server, the reference run,
and a summary of the injected faults printed at the end of the session."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import fault_harness  # noqa: E402


def tiny_config(root: Path, **overrides) -> dict:
    """3 epochs x 4 steps on digits, a 3-layer CNN, 16-d; m-per-class sampler, flips, warm-up,
    a step schedule and a test evaluation every epoch (as tests/train/test_resume.py)."""
    cfg = {
        "dataset": {"name": "digits", "root": str(root), "image_size": 32, "resize": 32, "train_crop": "random",
                    "batch_size": 32, "eval_batch_size": 512, "sampler": "m_per_class", "m": 8, "hflip": 0.5},
        "model": {"backbone": "tiny_cnn", "backbone_kwargs": {"widths": [16, 32, 32], "strides": [2, 2, 2]},
                  "embedding_size": 16},
        "loss": {"name": "pfml", "hparams": {"proxies_per_class": 2}},
        "optimizer": {"name": "adam", "lr": 1e-3, "lr_mult": {"loss": 100}},
        "schedule": {"name": "step", "step": 2, "gamma": 0.5},
        "warmup_epochs": 1,
        "checkpoint": {"keep": 2},
        "epochs": 3,
        "steps_per_epoch": 4,
        "seed": 3,
        "threads": 1,
        "device": "cpu",  # bit-identical resumes; the CUDA lane is tests/cuda
    }
    cfg.update(copy.deepcopy(overrides))
    return cfg


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    from dmlrepro.data import prepare

    root = tmp_path_factory.mktemp("faults-data")
    prepare("digits", root, progress=False)
    return root


@pytest.fixture(scope="session")
def run_config(data_root, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults-config") / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_config(data_root)))
    return path


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = fault_harness.ForkServer(tmp_path_factory.mktemp("faults-slots"))
    yield srv
    srv.close()


def run_cli(args: list[str], env_extra: dict[str, str] | None = None, timeout: float = 300,
            popen: bool = False):
    """``python -m dmlrepro.train.cli ARGS`` in a fresh process (1 thread)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLREPRO_TEST_")}
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env_extra or {})})
    cmd = [sys.executable, "-m", "dmlrepro.train.cli", *args]
    if popen:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def reference(run_config, tmp_path_factory) -> Path:
    """The undisturbed run, in a fresh `python -m dmlrepro.train.cli train` process."""
    out = tmp_path_factory.mktemp("faults-ref") / "run"
    res = run_cli(["train", str(run_config), str(out), "--no-progress"])
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def pytest_terminal_summary(terminalreporter):
    if fault_harness.SUMMARY:
        terminalreporter.section("fault injection")
        for line in fault_harness.SUMMARY:
            terminalreporter.write_line(line)
