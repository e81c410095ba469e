"""A failed run no longer holds back the report (docs/workflow.md#when-runs-fail): each train or search
job records its failed attempt (dmlrepro.run_failures), and with `skip_failed_runs` the workflow
leaves out the experiments with such a run and lists them in the report as not run, with the error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from dmlrepro.run_failures import EXIT_INTERRUPTED, failed_experiments, recorded_failure
from dmlrepro.run_table import ResultsLayout
from dmlrepro.selection import Selection

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


class RunInterrupted(Exception):
    """As dmlrepro.train.preemption's: a preempted run, checkpointed, to be resumed."""


def test_a_failed_attempt_is_recorded_with_its_logs_last_line(tmp_path):
    log, record = tmp_path / "train.log", tmp_path / "failed" / "r1.json"
    log.write_text("epoch 1/3\nTraceback (most recent call last):\n  ...\nRuntimeError: CUDA out of memory\n\n")
    with pytest.raises(RuntimeError), recorded_failure(record, log):
        raise RuntimeError("see the log")
    entry = json.loads(record.read_text())
    assert entry["error"] == "RuntimeError: CUDA out of memory" and entry["log"] == str(log)
    with recorded_failure(record, log):  # the next attempt starts: the record goes, and success writes none
        assert not record.exists()
    assert not record.exists()


def test_a_job_server_exit_status_without_a_log_is_the_error(tmp_path):
    record = tmp_path / "r1.json"
    with pytest.raises(SystemExit), recorded_failure(record, tmp_path / "missing.log"):
        sys.exit(1)
    assert json.loads(record.read_text())["error"] == "exit status 1"


@pytest.mark.parametrize("stop", [RunInterrupted("preempted"), SystemExit(EXIT_INTERRUPTED), KeyboardInterrupt()])
def test_an_interrupted_run_is_no_failure(tmp_path, stop):
    """A preemption checkpoints and exits 75 for SLURM / Snakemake to resume the run: not a failure."""
    record = tmp_path / "r1.json"
    with pytest.raises(type(stop)), recorded_failure(record, tmp_path / "log"):
        raise stop
    assert not record.exists()


def test_the_experiments_of_failed_runs_leave_the_selection_with_the_error(tmp_path):
    layout = ResultsLayout(str(tmp_path), "data")
    run = SimpleNamespace(run_id="pfml-cub200-s1-abc", method="pfml", dataset="cub200", seed=1)
    other = SimpleNamespace(run_id="pa-cub200-s0-def", method="proxy_anchor", dataset="cub200", seed=0)
    runs = {"table1": [other, run], "table3": [other]}
    table = SimpleNamespace(experiments=list(runs), experiment_runs=lambda e: runs[e], experiment_searches=lambda e: [])
    record = Path(layout.failure(run.run_id))
    with pytest.raises(ValueError), recorded_failure(record, tmp_path / "no.log"):
        raise ValueError("proxies diverged")
    reasons = failed_experiments(table, layout)
    assert list(reasons) == ["table1"]
    assert "run pfml-cub200-s1-abc (pfml on cub200, seed 1) failed: ValueError: proxies diverged" in reasons["table1"]
    selection = Selection({}, ["table1", "table3"], ["table1", "table3"]).without(reasons)
    assert selection.experiments == ["table3"]
    assert selection.not_run() == [{"experiment": "table1", "reason": reasons["table1"]}]


FAILING_LOSS = """
import torch
from torch import nn

from dmlrepro.losses import Paper, register_loss


@register_loss("always_fails", paper=Paper("test", "a loss that fails in its first step"))
class AlwaysFails(nn.Module):
    def __init__(self, num_classes: int, embedding_size: int):
        super().__init__()

    def forward(self, embeddings, labels):
        raise RuntimeError("the loss failed on purpose")
"""


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--configfile", str(workdir / "config.yaml"), "--cores", "1", *args]
    pythonpath = os.pathsep.join(filter(None, [str(workdir), os.environ.get("PYTHONPATH")]))  # + failing_loss.py
    env = {**os.environ, "PYTHONPATH": pythonpath, "TMPDIR": str(workdir), "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_report_builds_without_the_failed_runs(tmp_path):
    (tmp_path / "failing_loss.py").write_text(FAILING_LOSS)
    config = yaml.safe_load((REPO / "tests" / "workflow" / "tiny.yaml").read_text())
    config["methods"]["broken"] = {"loss": {"name": "failing_loss:AlwaysFails"}}
    kept = config["experiments"]["table"]
    config["experiments"] = {"table": kept, "broken_table": {**kept, "methods": ["proxy_anchor", "broken"]}}
    config["methods"] = {k: v for k, v in config["methods"].items() if k in ("proxy_anchor", "pfml", "broken")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))

    first = _snakemake(tmp_path, "--keep-going")
    assert first.returncode != 0 and not (tmp_path / "results" / "report" / "index.html").exists(), first.stderr[-3000:]
    assert (tmp_path / "results" / "sections" / "table" / "section.json").exists(), first.stderr[-3000:]
    records = sorted((tmp_path / "results" / "failed").iterdir())  # the broken method's two seeds
    assert len(records) == 2 and all(
        "the loss failed on purpose" in json.loads(r.read_text())["error"] for r in records
    )

    second = _snakemake(tmp_path, "--config", "skip_failed_runs=True")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    html = (tmp_path / "results" / "report" / "index.html").read_text()
    assert "broken_table" in html and "the loss failed on purpose" in html
    assert "Training run" not in second.stdout + second.stderr  # nothing retrained: the others had finished
