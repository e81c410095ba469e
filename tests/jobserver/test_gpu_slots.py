"""dmlrepro.gpu_slots on a simulated device list (no GPU needed): every job that asks for a GPU sees
one of its own in CUDA_VISIBLE_DEVICES (the hook: each test job records what it saw, and when); 6
concurrent jobs on 3 slots never share one, served or in-process; a killed job's slot is reused,
but not while its server child still runs; two workflows (two servers) on the same device list do
not collide; a `gpus:` entry that is not visible is a one-line error; onstart caps the GPU jobs at
the slot count. tests/workflow/test_gpu_workflow.py runs the same through Snakemake."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake.resources import Resources

from dmlrepro import gpu_slots, jobserver

TARGETS = """
import json, os, signal, time
def hold(path, seconds, ignore_term=False):
    if ignore_term:  # a child that takes its time to stop (a run checkpointing)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    seen = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "slot": os.environ.get("DMLREPRO_GPU_SLOT"),
            "pid": os.getpid(), "start": time.time()}
    with open(path + ".tmp", "w") as f:
        json.dump(seen, f)
    os.replace(path + ".tmp", path)
    time.sleep(seconds)
    with open(path + ".tmp", "w") as f:
        json.dump({**seen, "end": time.time()}, f)
    os.replace(path + ".tmp", path)
"""
ENTRY_POINTS = {"gputargets:hold"}


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The test targets on the path; a simulated node with GPUs 0, 1, 2 and its own lock folder."""
    (tmp_path / "gputargets.py").write_text(TARGETS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(gpu_slots.SLOTS_ENV, "0,1,2")
    monkeypatch.setenv(gpu_slots.JOBS_PER_GPU_ENV, "1")
    monkeypatch.setenv(gpu_slots.LOCKS_ENV, str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(jobserver.JOBSERVER_ENV, raising=False)
    return tmp_path


def _server(folder: Path) -> jobserver.Server:
    folder.mkdir()
    server = jobserver.start(folder, preload=("gputargets",), entry_points=ENTRY_POINTS)
    os.environ.pop(jobserver.JOBSERVER_ENV)  # each job names its server itself
    return server


def _job(folder: Path, name: str, seconds: float, server=None, gpu=1, ignore_term=False, **env) -> subprocess.Popen:
    """A job (what a workflow script is) asking for `gpu` GPUs, served by `server` or in-process."""
    code = (
        "from dmlrepro.jobserver import run_job; "
        f"run_job('gputargets:hold', {name!r}, {seconds}, ignore_term={ignore_term}, log={name + '.log'!r}, gpu={gpu})"
    )
    env = {**os.environ, **env, **({jobserver.JOBSERVER_ENV: str(server.folder / "server.sock")} if server else {})}
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=folder, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _seen(path: Path, key: str = "start", timeout: float = 60.0) -> dict:
    """What the job at `path` recorded, once it has recorded `key`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and key in (record := json.loads(path.read_text())):
            return record
        time.sleep(0.05)
    raise AssertionError(f"{path.name}: no {key!r} within {timeout} s")


def _gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _assert_never_shared(records: list[dict], per_gpu: int = 1) -> None:
    """Each job saw its own slot as CUDA_VISIBLE_DEVICES; no device held more than `per_gpu` jobs at once."""
    assert all(r["visible"] == r["slot"] and r["slot"] in {"0", "1", "2"} for r in records), records
    for device in {r["slot"] for r in records}:
        events = sorted(
            [(r["start"], 1) for r in records if r["slot"] == device]
            + [(r["end"], -1) for r in records if r["slot"] == device]
        )
        running = [sum(step for _, step in events[: i + 1]) for i in range(len(events))]
        assert max(running) <= per_gpu, (device, records)


@pytest.mark.parametrize("servers", [0, 1, 2], ids=["in-process", "served", "two-workflows"])
def test_six_concurrent_jobs_on_three_slots_never_share_one(node, servers):
    """6 jobs at once on GPUs 0, 1, 2: each runs on a device of its own, 3 wait for a free one. With
    two servers (two workflows on one node, one lock folder), 3 jobs each."""
    started = [_server(node / f"server{i}") for i in range(servers)]
    try:
        jobs = [_job(node, f"job{i}.json", 1.5, started[i % servers] if servers else None) for i in range(6)]
        errors = [job.communicate(timeout=120)[1] for job in jobs]
    finally:
        for server in started:
            jobserver.stop(server)
    assert [job.returncode for job in jobs] == [0] * 6, errors
    records = [json.loads((node / f"job{i}.json").read_text()) for i in range(6)]
    assert {r["slot"] for r in records} == {"0", "1", "2"}
    _assert_never_shared(records)
    assert any("waiting for a free GPU slot" in error for error in errors)  # 6 jobs, 3 slots: someone waited
    if servers:
        assert all(
            f"on GPU {r['slot']} (CUDA_VISIBLE_DEVICES={r['slot']})" in (node / f"job{i}.json.log").read_text()
            for i, r in enumerate(records)
        )


def test_jobs_per_gpu_puts_that_many_jobs_on_a_device(node, monkeypatch):
    monkeypatch.setenv(gpu_slots.JOBS_PER_GPU_ENV, "2")
    jobs = [_job(node, f"job{i}.json", 1.5) for i in range(6)]
    errors = [job.communicate(timeout=120)[1] for job in jobs]
    assert [job.returncode for job in jobs] == [0] * 6, errors
    records = [json.loads((node / f"job{i}.json").read_text()) for i in range(6)]
    assert sorted(r["slot"] for r in records) == ["0", "0", "1", "1", "2", "2"]  # first slots first, then seconds
    _assert_never_shared(records, per_gpu=2)


def test_a_job_asking_two_gpus_sees_two_devices_and_one_asking_none_sees_them_as_they_are(node):
    two = _job(node, "two.json", 0.1, gpu=2)
    none = _job(node, "none.json", 0.1, gpu=0, CUDA_VISIBLE_DEVICES="5")
    assert two.wait(timeout=60) == 0 and none.wait(timeout=60) == 0
    seen = json.loads((node / "two.json").read_text())
    assert seen["visible"] == seen["slot"] == "0,1"
    assert json.loads((node / "none.json").read_text())["visible"] == "5"


@pytest.mark.parametrize("kill", ["job", "child", "in-process job"])
def test_a_killed_jobs_slot_is_reused(node, monkeypatch, kill):
    """On one GPU: a job is SIGKILLed (the job's process, or the server child running it); the next
    job gets the GPU, and does not wait for the first one's 600 s."""
    monkeypatch.setenv(gpu_slots.SLOTS_ENV, "0")
    server = None if kill == "in-process job" else _server(node / "server")
    try:
        first = _job(node, "first.json", 600, server)
        seen = _seen(node / "first.json")
        assert seen["slot"] == "0"
        os.kill(seen["pid"] if kill == "child" else first.pid, signal.SIGKILL)
        assert first.wait(timeout=30) in (-9, 137)  # the job, or its child (the job exits with its status)
        assert _gone(seen["pid"])
        second = _job(node, "second.json", 0.1, server)
        _, err = second.communicate(timeout=60)
    finally:
        if server:
            jobserver.stop(server)
    assert second.returncode == 0, err
    assert json.loads((node / "second.json").read_text())["visible"] == "0"


def test_a_killed_jobs_slot_stays_held_while_its_child_runs(node, monkeypatch):
    """The job's process is SIGKILLed, its server child ignores the SIGTERM that follows and runs 3 s
    more: the slot is not handed out before the child has ended (the child holds the lock too)."""
    monkeypatch.setenv(gpu_slots.SLOTS_ENV, "0")
    server = _server(node / "server")
    try:
        first = _job(node, "first.json", 3, server, ignore_term=True)
        child = _seen(node / "first.json")
        first.kill()
        first.wait(timeout=30)
        second = _job(node, "second.json", 0.1, server)
        assert second.wait(timeout=60) == 0
    finally:
        jobserver.stop(server)
    first_end = _seen(node / "first.json", "end")["end"]
    assert json.loads((node / "second.json").read_text())["start"] >= first_end
    assert _gone(child["pid"])


# -- the workflow's side (onstart) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "environ, visible",
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, ["0", "1", "2"]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "GPU-1a2b, 3"}, ["GPU-1a2b", "3"]),
    ],
)
def test_the_visible_devices_are_cuda_visible_devices_entries(environ, visible):
    assert gpu_slots.visible_devices(environ) == visible


def test_the_workflow_devices_are_the_configs_gpus_or_every_visible_one():
    assert gpu_slots.workflow_devices(None, ["0", "1", "2"]) == ["0", "1", "2"]
    assert gpu_slots.workflow_devices([2, 0], ["0", "1", "2"]) == ["2", "0"]
    with pytest.raises(ValueError) as error:
        gpu_slots.workflow_devices([0, 7], ["0", "1", "2"])
    message = str(error.value)
    assert message.startswith("config gpus: 7 not visible on this node (visible: 0, 1, 2,") and "\n" not in message


def _workflow(**resources) -> SimpleNamespace:
    """What `offer` reads and sets of a Snakemake workflow once its scheduler exists."""
    return SimpleNamespace(
        global_resources=Resources.from_mapping(resources),
        scheduler=SimpleNamespace(global_resources=dict(resources), resources=dict(resources)),
    )


def test_onstart_names_the_devices_and_caps_the_gpu_jobs_at_the_slot_count(tmp_path):
    environ = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", gpu_slots.LOCKS_ENV: str(tmp_path)}
    workflow = _workflow()
    assert gpu_slots.offer(workflow, {"gpus": [1, 3], "jobs_per_gpu": 2}, environ) == 4
    assert (environ[gpu_slots.SLOTS_ENV], environ[gpu_slots.JOBS_PER_GPU_ENV]) == ("1,3", "2")
    assert workflow.global_resources["gpu"].value == 4
    assert workflow.scheduler.global_resources["gpu"] == workflow.scheduler.resources["gpu"] == 4
    given = _workflow(gpu=1)  # --resources gpu=1 stays
    assert gpu_slots.offer(given, {"gpus": None, "jobs_per_gpu": 1}, environ) == 4
    assert given.global_resources["gpu"].value == given.scheduler.resources["gpu"] == 1


def test_onstart_without_gpus_hands_out_nothing():
    environ = {"CUDA_VISIBLE_DEVICES": "", gpu_slots.SLOTS_ENV: "0,1"}  # an outer workflow's, say
    workflow = _workflow()
    assert gpu_slots.offer(workflow, {"gpus": None, "jobs_per_gpu": 1}, environ) == 0
    assert gpu_slots.SLOTS_ENV not in environ and "gpu" not in workflow.global_resources
    with pytest.raises(ValueError, match="config gpus: 0 not visible on this node"):
        gpu_slots.offer(workflow, {"gpus": [0], "jobs_per_gpu": 1}, environ)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_a_lock_folder_this_user_cannot_write_is_one_clear_error(tmp_path):
    folder = tmp_path / "locks"
    folder.mkdir(mode=0o555)
    environ = {gpu_slots.SLOTS_ENV: "0", gpu_slots.LOCKS_ENV: str(folder)}
    with pytest.raises(PermissionError, match=f"cannot make {folder}/gpu-0-0.lock: the lock folder must be writable"):
        with gpu_slots.lease(1, environ):
            pass
