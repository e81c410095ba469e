"""The rehearsal of a cluster run (docs/slurm.md#rehearse-your-cluster-run) on the local SLURM cluster of
.ci/start-slurm: the commands the docs give a user, from the repository root, on config/paper.yaml with the
overlay config/rehearsal.yaml, and CUB_200_2011.tgz in its published layout (tests/integration/cub_archive.py:
3 images per class) served from 127.0.0.1: `dmlrepro plan`, then snakemake through the SLURM profile to the
target's report. What the test adds to the user's commands: `--directory` (a temporary working directory),
the served archive's port (`--config sources=...`) and faster status polling.

Needs `sinfo` to show an idle node (tests/integration/test_slurm.py): fails under CI=true without one, skipped
elsewhere.
"""

from __future__ import annotations

import csv
import functools
import http.server
import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..conftest import require
from .cub_archive import ARCHIVE, CLASSES, write_cub_archive
from .test_slurm import _PROBLEM, POLL, cancel_leftovers, slurm_jobs

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIGS = ("config/paper.yaml", "config/rehearsal.yaml")
TARGET = "pfml_table1"
PER_CLASS = 3
RESULTS = "results/rehearsal"  # config/rehearsal.yaml's `results`

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]


@contextmanager
def served(folder: Path):
    """An HTTP server on 127.0.0.1 serving `folder`: (its base URL, the paths it was asked for)."""
    asked: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args):
            asked.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def run(command: list[str], timeout: int) -> str:
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)}:\n{output[-6000:]}"
    return output


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The plan's screen, then the target built through SLURM from the served archive."""
    require(_PROBLEM)
    archive = write_cub_archive(tmp_path_factory.mktemp("served"), PER_CLASS)
    workdir = tmp_path_factory.mktemp("rehearsal")
    workdir.chmod(0o755)
    plan = run([str(BIN / "dmlrepro"), "plan", TARGET, "--configfile", *CONFIGS], timeout=300)
    with served(archive.parent) as (url, asked):
        started = time.monotonic()
        try:
            command = [str(BIN / "snakemake"), "--profile", "slurm", TARGET, "--configfile", *CONFIGS]
            command += [
                "--directory",
                str(workdir),
                *POLL,
                "--config",
                f"sources={{cub200: {{url: '{url}/{ARCHIVE}'}}}}",
            ]
            output = run(command, timeout=600)
        finally:
            cancel_leftovers(workdir)
    seconds = time.monotonic() - started
    print(f"rehearsal of {TARGET} through SLURM: {seconds:.0f} s")
    return {"plan": plan, "output": output, "workdir": workdir, "asked": asked, "seconds": seconds}


def test_the_plan_shows_the_rehearsal_before_submitting(rehearsal):
    plan = rehearsal["plan"]
    assert f"plan of {TARGET} --configfile {' '.join(CONFIGS)} (only_datasets: cub200)" in plan, plan
    assert "2 training jobs, 2 runs, 0 GPU-hours requested" in plan, plan  # PFML and CPML, one seed, CPU jobs
    # downloaded from `sources` (prepared: a rehearsal already ran from this checkout's root)
    assert any(line.split() in (["cub200", "download"], ["cub200", "prepared"]) for line in plan.splitlines()), plan


def test_the_archive_is_fetched_from_the_served_url_and_prepared(rehearsal):
    assert f"/{ARCHIVE}" in rehearsal["asked"], rehearsal["asked"]
    with open(rehearsal["workdir"] / "data/rehearsal/cub200/manifest.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == CLASSES * PER_CLASS
    assert len({row["label"] for row in rows}) == CLASSES


def test_the_training_jobs_went_through_sbatch(rehearsal):
    workdir = rehearsal["workdir"]
    runs = sorted(p.name for p in (workdir / RESULTS / "runs").iterdir())
    jobs = slurm_jobs(workdir)
    assert len(runs) == 2
    assert sorted(job.get("Comment", "") for job in jobs) == [f"rule_train_wildcards_{run}" for run in runs], jobs
    assert {job["JobState"] for job in jobs} == {"COMPLETED"}, [job["raw"] for job in jobs]
    for run_id in runs:
        metrics = json.loads((workdir / RESULTS / "runs" / run_id / "metrics.json").read_text())
        assert (metrics["status"], metrics["precision"]["device"]) == ("completed", "cpu")


def test_the_target_report_holds_the_table(rehearsal):
    report = rehearsal["workdir"] / RESULTS / "targets" / TARGET / "index.html"
    html = report.read_text(encoding="utf-8")
    assert "PFML Table 1" in html
    assert "Potential Field (Ours)" in html and "CPML (Sec. 3.4)" in html
    assert "built without cars196" in html  # the target's experiment on the selected dataset only, and why
    section = json.loads((rehearsal["workdir"] / RESULTS / "sections" / TARGET / "section.json").read_text())
    assert section  # the table as data (its shape: tests/report)
