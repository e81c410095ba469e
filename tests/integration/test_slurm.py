"""The SLURM profile (slurm/config.yaml) on a real SLURM cluster: the local one of .ci/start-slurm.

Needs `sinfo` to show an idle node with GPU gres: without one these tests fail under CI=true
(tests/conftest.py `require`) and are skipped elsewhere. The workflow runs in a temporary
--directory through `--profile <repo>/slurm`, overriding only the configfile and how soon the
executor polls; SLURM runs the jobs as the submitting user from that directory, so slurmd must
be able to read the repository and its .venv.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ..conftest import require

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = REPO / "tests/workflow/tiny.yaml"
SLOW_STEPS = Path(__file__).with_name("slow_steps")  # sitecustomize: DMLREPRO_TEST_STEP_SECONDS
POLL = ("--slurm-init-seconds-before-status-checks", "2", "--seconds-between-status-checks", "2")


def _slurm_problem() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "SLURM is not installed (CI starts a one-node cluster with .ci/start-slurm)"
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T %G"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 30 s (is slurmctld running? .ci/start-slurm)"
    nodes = [line.split() for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not any(state.rstrip("*") in ("idle", "mixed") for state, *_ in nodes):
        return f"no idle SLURM node (sinfo: {(done.stdout + done.stderr).strip() or 'nothing'}; .ci/start-slurm)"
    if not any("gpu" in "".join(gres) for _, *gres in nodes):
        return "no SLURM node with GPU gres (.ci/start-slurm configures two fake GPUs)"
    return None


_PROBLEM = _slurm_problem()
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    """A required integration check: fails under CI=true without the cluster, skips elsewhere."""
    require(_PROBLEM)


def snakemake(workdir: Path, config: Path, *args: str, env: dict | None = None, timeout: int = 420) -> str:
    command = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(config),
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    return output


def through_slurm(workdir: Path, config: Path, *args: str, **kw) -> str:
    return snakemake(workdir, config, "--profile", str(REPO / "slurm"), *POLL, *args, **kw)


def planned_jobs(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> count."""
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", output, re.MULTILINE)
        if m.group(1) != "total"
    }


def slurm_jobs(workdir: Path) -> list[dict[str, str]]:
    """Every job SLURM still knows (MinJobAge=300 keeps finished ones) that ran in `workdir`, oldest first."""
    listing = subprocess.run(
        ["squeue", "--states=all", "-h", "-o", "%i"], capture_output=True, text=True, check=True
    ).stdout.split()
    jobs = []
    for job_id in sorted(listing, key=int):
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
        fields = dict(re.findall(r"(\w+)=(\S*)", shown))
        if fields.get("WorkDir") == str(workdir):
            jobs.append({**fields, "raw": shown})
    return jobs


def cancel_leftovers(workdir: Path) -> None:
    for job in slurm_jobs(workdir):
        if job.get("JobState") in ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING"):
            subprocess.run(["scancel", job["JobId"]], capture_output=True)


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# -- the tiny workflow through the profile -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_on_slurm(tmp_path_factory):
    """tests/workflow/tiny.yaml with one seed per cell (tests/workflow checks the seeds' statistics)
    plus per-dataset training resources, run to the end through SLURM."""
    workdir = tmp_path_factory.mktemp("slurm_workflow")
    workdir.chmod(0o755)
    config = yaml.safe_load(TINY.read_text())
    for experiment in config["experiments"].values():
        experiment.pop("seeds", None)
    config["resources"] = {
        "train": {"default": {"runtime": 5, "mem_mb": 1000, "gpu": 1}, "synthetic": {"mem_mb": 1200}}
    }
    config["defaults"]["device"] = "cpu"  # the CI node's GPUs are fake: device auto would stop a GPU job
    path = write_config(workdir / "tiny_slurm.yaml", config)
    plan = planned_jobs(through_slurm(workdir, path, "-n"))
    started = time.monotonic()
    try:
        output = through_slurm(workdir, path, timeout=600)
    finally:
        cancel_leftovers(workdir)
    return {"workdir": workdir, "config": path, "plan": plan, "output": output, "seconds": time.monotonic() - started}


def test_training_jobs_go_through_sbatch_with_a_gpu(tiny_on_slurm):
    workdir = tiny_on_slurm["workdir"]
    jobs = slurm_jobs(workdir)
    runs = sorted(p.name for p in (workdir / "results/runs").iterdir())
    searches = sorted(p.name for p in (workdir / "results/search").iterdir())
    comments = sorted(job.get("Comment", "") for job in jobs)
    # one sbatch per run and per search; everything else (prepare_dataset, label_noise, aggregate,
    # report) is a local rule
    assert comments == sorted(
        [f"rule_train_wildcards_{run}" for run in runs] + [f"rule_search_wildcards_{search}" for search in searches]
    ), comments
    assert tiny_on_slurm["plan"]["train"] == len(runs) and tiny_on_slurm["plan"]["search"] == len(searches) == 1
    trials = yaml.safe_load(tiny_on_slurm["config"].read_text())["experiments"]["search"]["search"]["trials"]
    for job in jobs:
        assert job["JobState"] == "COMPLETED", job["raw"]
        assert re.search(r"gres[:/]gpu[:=]1\b", job["raw"]), f"no GPU request: {job['raw']}"
        # resources.train.default.runtime; a search asks for it once per trial (its trials run one after another)
        minutes = 5 * (trials if job["Comment"].startswith("rule_search") else 1)
        assert job["TimeLimit"] == f"00:{minutes:02d}:00", job["raw"]
        assert "mem=1200M" in job["raw"], job["raw"]  # resources.train.synthetic.mem_mb over the default


def test_every_output_is_complete(tiny_on_slurm):
    workdir, plan = tiny_on_slurm["workdir"], tiny_on_slurm["plan"]
    experiments = yaml.safe_load(tiny_on_slurm["config"].read_text())["experiments"]
    for name, experiment in experiments.items():
        # without runs (no datasets, a search, an opt-in left out): no table rows to check
        if not experiment.get("datasets", True) or "search" in experiment or experiment.get("opt_in"):
            continue
        with open(workdir / f"results/experiments/{name}.csv") as handle:
            rows = list(csv.DictReader(handle))
        assert rows, f"results/experiments/{name}.csv is empty"
    for run in (workdir / "results/runs").iterdir():
        assert json.loads((run / "metrics.json").read_text())["status"] == "completed"
    for search in (workdir / "results/search").iterdir():
        assert json.loads((search / "best.json").read_text())["n_trials"] == 3
    assert not (workdir / "results/experiments/costly.csv").exists()  # opt-in, not chosen
    if "report" in plan:
        assert (workdir / "results/report/index.html").stat().st_size > 0


def test_rerun_through_the_profile_does_nothing(tiny_on_slurm):
    assert "Nothing to be done" in through_slurm(tiny_on_slurm["workdir"], tiny_on_slurm["config"], "-n")


# -- a run longer than its allocations -----------------------------------------------------------


def synthetic_proxy_anchor(experiment, *, images_per_class, epochs, steps_per_epoch, metrics, resources, **defaults):
    """A config of one cell, Proxy Anchor on 12 `synthetic` classes with tiny_cnn on the CPU (the CI node's GPUs
    are fake: device auto would stop a job that asked for one); `resources`: its resources.train."""
    dataset = {"image_size": 32, "resize": 32, "train_crop": "random", "batch_size": 16, "sampler": "m_per_class"}
    dataset.update(m=4, params={"num_classes": 12, "images_per_class": images_per_class})
    return {
        "data_root": "data",
        "results": "results",
        "defaults": {
            "device": "cpu",
            "model": {"backbone": "tiny_cnn", "embedding_size": 16},
            "dataset": dataset,
            "epochs": epochs,
            "steps_per_epoch": steps_per_epoch,
            "eval": {"every": 0, "before_training": False, "ks": [1, 2]},
            **defaults,
        },
        "datasets": {"synthetic": {"dataset": {"name": "synthetic"}}},
        "methods": {"proxy_anchor": {"loss": {"name": "proxy_anchor"}}},
        "experiments": {experiment: {"methods": ["proxy_anchor"], "datasets": ["synthetic"], "metrics": metrics}},
        "resources": {"train": resources},
    }


STEP_SECONDS = 1.0
RESUME = synthetic_proxy_anchor(
    "resume",
    images_per_class=80,
    epochs=3,
    steps_per_epoch=30,  # 90 steps of >= STEP_SECONDS: longer than one 1-minute allocation
    metrics=["recall@1", "recall@2"],
    # the shortest SLURM allows; warning 0: SLURM's own SIGTERM at the limit (a warning signal can
    # come up to a minute early, i.e. at once in a 1-minute job)
    resources={"default": {"runtime": 1, "mem_mb": 1000, "gpu": 1, "warning": 0}},
)


def test_a_run_longer_than_its_time_limit_resumes_across_allocations_to_the_same_result(tmp_path):
    config = write_config(tmp_path / "resume.yaml", RESUME)
    table = "results/experiments/resume.csv"
    reference, sliced = tmp_path / "undisturbed", tmp_path / "sliced"
    sliced.mkdir()
    # the undisturbed run, locally and at full speed, while the sliced one waits for SLURM
    undisturbed = subprocess.Popen(
        [
            str(SNAKEMAKE),
            "-s",
            str(REPO / "Snakefile"),
            "--directory",
            str(reference),
            "--configfile",
            str(config),
            "--cores",
            "1",
            table,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    env = {
        **os.environ,
        "DMLREPRO_TEST_STEP_SECONDS": str(STEP_SECONDS),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SLOW_STEPS), os.environ.get("PYTHONPATH")])),
    }
    try:
        # up to 5 allocations, not the profile's 3: on a loaded host each 1-minute allocation spends half its
        # time starting, and a third one that finishes the steps can be killed while it writes the outputs
        through_slurm(sliced, config, "--retries", "4", table, env=env, timeout=780)
    finally:
        cancel_leftovers(sliced)
        output, _ = undisturbed.communicate(timeout=300)
    assert undisturbed.returncode == 0, output[-6000:]
    [run] = [p.name for p in (reference / "results/runs").iterdir()]

    jobs = slurm_jobs(sliced)
    states = [job["JobState"] for job in jobs]
    assert len(jobs) >= 2 and states[-1] == "COMPLETED" and "TIMEOUT" in states[:-1], states
    assert all(job["Comment"] == f"rule_train_wildcards_{run}" for job in jobs)
    log = (sliced / f"results/logs/train/{run}.log").read_text()
    assert "resuming from" in log, log[-3000:]

    ours = json.loads((sliced / f"results/runs/{run}/metrics.json").read_text())
    theirs = json.loads((reference / f"results/runs/{run}/metrics.json").read_text())
    assert ours["status"] == theirs["status"] == "completed"
    assert ours["global_steps"] == theirs["global_steps"] == 90
    assert ours["metrics"] == theirs["metrics"]  # deterministic on CPU: bit-for-bit, not approximately

    def losses(workdir: Path) -> list[str]:
        with open(workdir / f"results/runs/{run}/train_log.csv") as handle:
            return [row["loss"] for row in csv.DictReader(handle)]

    assert losses(sliced) == losses(reference)
