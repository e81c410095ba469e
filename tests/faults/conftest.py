"""Fixtures of the fault-injection tests: the digits data, the fork server, the workflow's job
server, the reference run (and its phases), and a summary of the injected faults printed at the
end of the session."""

from __future__ import annotations

import copy
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
        "dataset": {
            "name": "digits",
            "root": str(root),
            "image_size": 32,
            "resize": 32,
            "train_crop": "random",
            "batch_size": 32,
            "eval_batch_size": 512,
            "sampler": "m_per_class",
            "m": 8,
            "hflip": 0.5,
        },
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [16, 32, 32], "strides": [2, 2, 2]},
            "embedding_size": 16,
        },
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


@pytest.fixture(scope="session")
def reference_job(run_config, tmp_path_factory) -> fault_harness.Job:
    """The undisturbed run, in a fresh `python -m dmlrepro.cli train` process that records its
    phases (fault_harness.Marker)."""
    folder = tmp_path_factory.mktemp("faults-ref")
    marker = fault_harness.Marker(folder / "marker")
    job = fault_harness.start_cli(run_config, folder / "run", folder / "run.log", marker)
    assert job.wait() == 0, job.log()
    return job


@pytest.fixture(scope="session")
def reference(reference_job) -> Path:
    """The undisturbed run's folder."""
    return reference_job.log_path.parent / "run"  # the OUTDIR reference_job trains into


@pytest.fixture
def job_server():
    srv = fault_harness.JobServer()
    yield srv
    srv.close()


def pytest_terminal_summary(terminalreporter):
    if fault_harness.SUMMARY:
        terminalreporter.section("fault injection")
        for line in fault_harness.SUMMARY:
            terminalreporter.write_line(line)
