"""A training run forked from the job server (dmlrepro.jobserver, what the local workflow does) is
bit-identical to the same run in its own process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dmlrepro import jobserver
from dmlrepro.train import list_checkpoints, read_checkpoint


def _train_job(config: dict, folder: str, cwd, env: dict) -> None:
    code = (
        f"from dmlrepro.jobserver import run_job; run_job('dmlrepro.train:train_run', {config!r}, {folder!r}, "
        f"progress=False, log='{folder}.log')"
    )
    job = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True
    )
    assert job.returncode == 0, job.stderr + (cwd / f"{folder}.log").read_text()


@pytest.mark.slow
def test_a_run_through_the_job_server_is_bit_identical(tiny, tmp_path):
    config = tiny(epochs=2, steps_per_epoch=3, num_workers=1)
    (tmp_path / "server").mkdir()
    server = jobserver.start(tmp_path / "server")
    try:
        _train_job(config, "served", tmp_path, {})
    finally:
        jobserver.stop(server)
    _train_job(config, "inline", tmp_path, {jobserver.JOBSERVER_ENV: ""})
    served, inline = (
        read_checkpoint(list_checkpoints(tmp_path / name / "checkpoints")[-1]) for name in ("served", "inline")
    )
    for key in inline["model"]:
        assert torch.equal(served["model"][key], inline["model"][key]), key
    assert (tmp_path / "served" / "metrics.json").read_text() == (tmp_path / "inline" / "metrics.json").read_text()
