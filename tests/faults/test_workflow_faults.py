"""Fault injection into the Snakemake workflow (docs/training.md, faults b and c): SIGKILL the
controller while train jobs run -- alone (its jobs live on as orphans, still training when the
rerun starts, and the rerun's train job waits for them on the run lock; both asserted) or with
its whole process group (a crashed node) -- and leave a half-written metrics.json behind; the
rerun the user is told to make (`snakemake --unlock`, then `--rerun-incomplete`) completes with
tables and metrics identical to an undisturbed run."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fault_harness

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
CONFIG = Path(__file__).with_name("workflow.yaml")
# tests/integration/slow_steps: with DMLREPRO_TEST_STEP_GATE=path set, every training step of a process
# started with it on PYTHONPATH waits while that file exists (results unchanged), so orphaned train
# jobs are still training when the rerun's train jobs start
SLOW_STEPS = REPO / "tests/integration/slow_steps"


def _command(workdir: Path, *args: str) -> list[str]:
    return [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(CONFIG),
        "--cores",
        "2",
        *args,
    ]


def snakemake(workdir: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(_command(workdir, *args), capture_output=True, text=True, timeout=600)
    if ok:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _log_without_seconds(text: str) -> list[dict[str, str]]:
    """A train_log.csv by column name, without `seconds` (wall time, the one column that may differ)."""
    return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(io.StringIO(text))]


def outputs(workdir: Path) -> dict[str, object]:
    """Every table and every run's metrics.json / train_log.csv (without `seconds`), by path."""
    files = {}
    for p in sorted((workdir / "results").rglob("*")):
        rel = str(p.relative_to(workdir))
        if p.suffix == ".csv" and "experiments" in rel or p.name == "metrics.json":
            files[rel] = p.read_text()
        elif p.name == "train_log.csv":
            files[rel] = _log_without_seconds(p.read_text())
    return files


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wf-ref")
    snakemake(workdir)
    files = outputs(workdir)
    assert any(k.endswith("table.csv") for k in files) and sum(k.endswith("metrics.json") for k in files) == 2
    return files


def _start_and_kill(
    workdir: Path, group: bool, extra=(), wait_for="checkpoints/ckpt-e0002-*.pt", env: dict | None = None
) -> tuple[list[int], Path]:
    """Start the workflow, wait until a run folder has a file ``<run>/<wait_for>`` written
    after the start (a checkpoint, or the run lock: a train job is running), SIGKILL."""
    t0 = time.time()
    proc = subprocess.Popen(
        _command(workdir, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )
    end = t0 + 300

    def found():
        return [p for p in (workdir / "results" / "runs").glob(f"*/{wait_for}") if p.stat().st_mtime >= t0]

    while not found():
        assert proc.poll() is None, "the workflow ended before a checkpoint was written"
        assert time.time() < end
        time.sleep(0.02)
    ps = subprocess.run(["ps", "-o", "pid=", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    jobs = [int(p) for p in ps if int(p) != proc.pid]
    if group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    run = found()[0].parents[1]
    return jobs, run


def _waiting(workdir: Path) -> list[Path]:
    """Train logs of rerun jobs that found their run folder locked by another trainer (engine._run_lock)."""
    return [
        p
        for p in (workdir / "results/logs/train").glob("*.log")
        if "being trained by another process" in p.read_text(errors="replace")
    ]


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def test_workflow_killed_twice_with_half_written_metrics(undisturbed, tmp_path):
    # 1. the whole workflow (controller and jobs: a crashed node) SIGKILLed after a job's first
    #    checkpoint; the killed job was writing its metrics.json without an atomic writer
    _, run = _start_and_kill(tmp_path, group=True)
    name = str(run.relative_to(tmp_path) / "metrics.json")
    (run / "metrics.json").write_text(undisturbed[name][: len(undisturbed[name]) // 2])
    refused = snakemake(tmp_path, "-n", ok=False)
    assert refused.returncode != 0 and "IncompleteFilesException" in refused.stdout + refused.stderr
    assert name in refused.stdout + refused.stderr
    snakemake(tmp_path, "--unlock")
    # 2. the rerun's controller alone SIGKILLed (its train jobs live on as orphans, held before
    #    their next step by a gate file), and the workflow rerun at once, while the orphans still
    #    train in the same run folders: the rerun's train jobs must wait for them (the run lock);
    #    once one does, the gate opens and the orphans finish
    gate = tmp_path / "orphans.gate"
    gate.touch()
    slow = {
        **os.environ,
        "DMLREPRO_TEST_STEP_GATE": str(gate),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SLOW_STEPS), os.environ.get("PYTHONPATH")])),
    }
    try:
        jobs, _ = _start_and_kill(tmp_path, group=False, extra=("--rerun-incomplete",), wait_for=".lock", env=slow)
        orphans = _alive(jobs)
        assert orphans, "no train job outlived its killed controller"
        snakemake(tmp_path, "--unlock")
        rerun_log = open(tmp_path / "rerun.log", "w")
        rerun = subprocess.Popen(_command(tmp_path, "--rerun-incomplete"), stdout=rerun_log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while not _waiting(tmp_path):
            assert rerun.poll() is None, "the rerun ended without waiting for the orphans"
            assert time.time() < deadline, "the rerun's train jobs never waited for the orphans"
            time.sleep(0.2)
        waited = len(_waiting(tmp_path))
    finally:
        gate.unlink(missing_ok=True)
    rerun.wait(timeout=600)
    rerun_log.close()
    assert rerun.returncode == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    assert outputs(tmp_path) == undisturbed
    deadline = time.time() + 120
    while _alive(orphans) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(orphans)
    assert outputs(tmp_path) == undisturbed  # the orphans' late writes changed nothing
    fault_harness.SUMMARY.append(
        "b+c) workflow SIGKILLed twice: whole process group after a job's first checkpoint, with half a "
        "metrics.json left in its run folder (snakemake refuses it as incomplete), then the rerun's controller "
        f"alone ({len(orphans)} orphaned train job(s) still running at the next rerun, {waited} rerun job(s) "
        "waited on the run lock); --unlock + --rerun-incomplete: tables, metrics and logs identical"
    )
