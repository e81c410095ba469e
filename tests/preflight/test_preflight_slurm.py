"""The preflight through the SLURM profile on the local cluster (.ci/start-slurm): the workflow target
as one GPU job, and a training job that says at once that it cannot finish within its budget.

Needs `sinfo` to show an idle node with GPU gres: without one these tests fail under CI=true
(tests/conftest.py `require`) and are skipped elsewhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import require
from ..integration.test_slurm import POLL, _slurm_problem, cancel_leftovers, slurm_jobs, write_config

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
SLOW_STEPS = REPO / "tests/integration/slow_steps"  # sitecustomize: DMLREPRO_TEST_STEP_SECONDS
TINY = {
    "data_root": "data",
    "results": "results",
    "defaults": {
        "device": "cpu",  # the CI node's GPUs are fake: device auto would stop a job that asked for one
        "model": {"backbone": "tiny_cnn", "embedding_size": 16},
        "dataset": {
            "image_size": 32,
            "resize": 32,
            "train_crop": "random",
            "batch_size": 16,
            "sampler": "m_per_class",
            "m": 4,
            "params": {"num_classes": 12, "images_per_class": 8},
        },
        "epochs": 2,
        "eval": {"every": 0, "before_training": False, "ks": [1, 2]},
    },
    "datasets": {"synthetic": {"dataset": {"name": "synthetic"}}},
    "methods": {
        "pfml": {"loss": {"name": "pfml", "hparams": {"proxies_per_class": 2, "reduction": "mean"}}},
        "proxy_anchor": {"loss": {"name": "proxy_anchor"}},
    },
    "experiments": {"table": {"methods": ["pfml", "proxy_anchor"], "datasets": ["synthetic"], "metrics": ["recall@1"]}},
    "resources": {"train": {"default": {"runtime": 5, "mem_mb": 1500, "gpu": 1}}},
}


_PROBLEM = _slurm_problem()
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    require(_PROBLEM)


def through_slurm(workdir: Path, config: dict, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The workflow through the SLURM profile; its exit status is the caller's to check."""
    path = write_config(workdir / "config.yaml", config)
    try:
        return subprocess.run(
            [
                str(SNAKEMAKE),
                "-s",
                str(REPO / "Snakefile"),
                "--directory",
                str(workdir),
                "--configfile",
                str(path),
                "--profile",
                str(REPO / "slurm"),
                *POLL,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    finally:
        cancel_leftovers(workdir)


def test_preflight_target_is_one_gpu_job_writing_json_and_table(tmp_path):
    tmp_path.chmod(0o755)
    done = through_slurm(tmp_path, TINY, "preflight")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    [job] = slurm_jobs(tmp_path)  # the preflight alone: `all` is not run, nothing depends on it
    assert job["Comment"] == "rule_preflight" and job["JobState"] == "COMPLETED", job["raw"]
    assert re.search(r"gres[:/]gpu[:=]1\b", job["raw"]) and job["TimeLimit"] == "00:05:00", job["raw"]
    doc = json.loads((tmp_path / "results/preflight/preflight.json").read_text())
    assert [entry["status"] for entry in doc["configs"]] == ["ok", "ok"]
    assert doc["total_hours"] > 0 and doc["over_budget"] == []
    table = (tmp_path / "results/preflight/preflight.txt").read_text()
    assert "every shape stepped and every run fits its time budget" in table
    assert "retries = 2" in table  # the profile's, handed to the job through its environment
    assert not (tmp_path / "results/runs").exists()


def test_training_job_that_cannot_finish_says_so_after_its_first_epoch(tmp_path):
    """1-minute limit, no retries, 4 epochs of >= 20 s: the log warns after epoch 1, before SLURM ends it."""
    tmp_path.chmod(0o755)
    config = {
        **TINY,
        "experiments": {"slow": {"methods": ["proxy_anchor"], "datasets": ["synthetic"], "metrics": ["recall@1"]}},
        "resources": {"train": {"default": {"runtime": 1, "mem_mb": 1500, "gpu": 1, "warning": 0}}},
    }
    config["defaults"] = {
        **TINY["defaults"],
        "epochs": 4,
        "steps_per_epoch": 20,
        "dataset": {**TINY["defaults"]["dataset"], "params": {"num_classes": 12, "images_per_class": 80}},
    }
    env = {
        **os.environ,
        "DMLREPRO_TEST_STEP_SECONDS": "1.0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SLOW_STEPS), os.environ.get("PYTHONPATH")])),
    }
    through_slurm(tmp_path, config, "--retries", "0", "results/experiments/slow.csv", env=env)
    [log] = list((tmp_path / "results/logs/train").glob("*.log"))
    text = log.read_text()
    warning = [line for line in text.splitlines() if "this run cannot finish" in line]
    assert len(warning) == 1, text[-3000:]
    assert "epoch 1 took" in warning[0] and "time limit 1 min × (retries 0 + 1) = 0.02 h" in warning[0]
