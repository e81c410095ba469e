"""CPUs of a training job: `resources.train.<dataset>.cpus` becomes the rule's threads, which the
SLURM profile submits as --cpus-per-task, and a run with `num_workers: auto` gives all but one of
them to its DataLoader workers. The local cluster does not bind CPUs, so the test reads the job's
allocation from SLURM (scontrol) and what the run used from its own log and config.yaml."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from ..conftest import require
from .test_slurm import (
    REPO,
    SNAKEMAKE,
    _slurm_problem,
    cancel_leftovers,
    slurm_jobs,
    synthetic_proxy_anchor,
    through_slurm,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = synthetic_proxy_anchor(
    "cpus",
    images_per_class=6,
    epochs=1,
    steps_per_epoch=2,
    metrics=["recall@1"],
    resources={"default": {"runtime": 5, "mem_mb": 1000, "gpu": 1, "cpus": 1}, "synthetic": {"cpus": 2}},  # 2 CPUs here
    num_workers="auto",
)
TABLE = "results/experiments/cpus.csv"


def test_cpus_become_the_train_jobs_threads(tmp_path):
    """Without SLURM: a local run gets the dataset's cpus as its threads (the CPU budget it logs)."""
    config = {**CONFIG, "resources": {"train": {"default": {"cpus": 3}, "synthetic": {"cpus": 12}}}}
    path = write_config(tmp_path / "cpus.yaml", config)
    done = subprocess.run(
        [
            str(SNAKEMAKE),
            "-s",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(path),
            "--cores",
            "16",
            TABLE,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    [log] = (tmp_path / "results/logs/train").iterdir()
    assert re.search(r"CPUs available \(threads asked: 12\)", log.read_text()), log.read_text()[-3000:]


@pytest.mark.slurm
def test_the_job_is_allocated_its_cpus_and_the_run_uses_them(tmp_path):
    require(_slurm_problem())
    tmp_path.chmod(0o755)
    path = write_config(tmp_path / "cpus.yaml", CONFIG)
    try:
        through_slurm(tmp_path, path, TABLE, timeout=600)
    finally:
        cancel_leftovers(tmp_path)
    [job] = [j for j in slurm_jobs(tmp_path) if j.get("Comment", "").startswith("rule_train")]
    assert job["JobState"] == "COMPLETED", job["raw"]
    assert job["NumCPUs"] == "2" and re.search(r"\bCPUs/Task=2\b", job["raw"]), job["raw"]
    [run] = (tmp_path / "results/runs").iterdir()
    log = (tmp_path / "results/logs/train" / f"{run.name}.log").read_text()
    # 2 CPUs: one DataLoader worker and the training process (one torch thread)
    assert re.search(r"2 CPUs available \(threads asked: 2\): num_workers 1, torch threads 1\b", log), log[-3000:]
    used = yaml.safe_load((run / "config.yaml").read_text())
    assert (used["num_workers"], used["threads"]) == (1, 1)


def test_launch_asks_submitit_for_the_cpus(tmp_path, monkeypatch):
    """`dmlrepro launch --cpus N` is the job's cpus_per_task (submitit's parameter for --cpus-per-task)."""
    import submitit

    from dmlrepro.train import cli

    seen = {}

    class Executor:
        cluster = "slurm"

        def __init__(self, **kw):
            pass

        def update_parameters(self, **kw):
            seen.update(kw)

        def submit(self, job):
            return type("Job", (), {"job_id": "1"})()

    monkeypatch.setattr(submitit, "AutoExecutor", Executor)
    conf = tmp_path / "run.yaml"
    conf.write_text(
        yaml.safe_dump({"dataset": {"name": "synthetic"}, "model": {"backbone": "tiny_cnn"}, "num_workers": "auto"})
    )
    assert cli.launch_main([str(conf), str(tmp_path / "out"), "--executor", "slurm", "--cpus", "12"]) == 0
    assert seen["cpus_per_task"] == 12
