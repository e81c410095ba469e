"""dmlrepro.jobserver: a job's function runs in a fork of the server, with the job's working
directory, environment, streams and log; its exit status is the job's; a cancelled job's child is
stopped; without a server the job runs in its own process (tests/train/test_served_run.py: a
training run through the server is bit-identical to one in-process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dmlrepro import jobserver

TARGETS = '''
import json, os, signal, sys, time
def record(path, word):
    print("hello from", word)
    print("to stderr", file=sys.stderr)
    with open(path, "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                   "env": os.environ.get("JOB_VALUE"), "word": word}, f)
def fail():
    raise ValueError("a failing job")
def exit_with(code):
    sys.exit(code)
def pools(path):
    import numpy  # loaded before the job (the server preloads it): threadpoolctl's part
    import faiss  # loaded by the job (not preloaded): OMP_NUM_THREADS's part
    from threadpoolctl import threadpool_info
    with open(path, "w") as f:
        json.dump({"faiss": faiss.omp_get_max_threads(),
                   "loaded": sorted({p["num_threads"] for p in threadpool_info()})}, f)
def sleep_forever(path):  # as the engine does: SIGTERM -> exit 75 (checkpoint, then retry)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(75))
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
'''


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A server (preloading the test targets' module) for jobs started from this test."""
    (tmp_path / "jobtargets.py").write_text(TARGETS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "server").mkdir()
    handle = jobserver.start(tmp_path / "server", preload=("jobtargets", "numpy"))
    yield handle
    jobserver.stop(handle)


def _job(tmp_path, call: str, env=None, **popen) -> subprocess.Popen:
    """A job process (what a workflow script is) that calls run_job."""
    code = f"from dmlrepro.jobserver import run_job; run_job({call})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_a_job_runs_in_a_child_of_the_server_with_its_cwd_env_and_log(server, tmp_path):
    job = _job(tmp_path, "'jobtargets:record', 'out.json', word='w', log='job.log'", env={"JOB_VALUE": "42"})
    out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err
    record = json.loads((tmp_path / "out.json").read_text())
    assert record["ppid"] == server.pid != job.pid
    assert (record["cwd"], record["env"], record["word"]) == (str(tmp_path), "42", "w")
    assert "hello from w" in (tmp_path / "job.log").read_text()
    assert "to stderr" in (tmp_path / "job.log").read_text()


@pytest.mark.parametrize("served", [True, False])
def test_a_jobs_thread_pools_are_its_threads_and_the_next_jobs_are_as_they_were(server, tmp_path, monkeypatch,
                                                                               served):
    """A job's budget reaches the pools loaded before it (numpy's BLAS) and those it loads (faiss's
    OpenMP), served or in its own process; the server's own pools stay as they were."""
    from threadpoolctl import threadpool_info

    if not served:
        monkeypatch.delenv(jobserver.JOBSERVER_ENV)
    for threads, name in ((1, "one.json"), (None, "default.json")):
        job = _job(tmp_path, f"'jobtargets:pools', {name!r}, log='job.log', threads={threads}")
        assert job.communicate(timeout=60)[1] == "" and job.returncode == 0
    assert json.loads((tmp_path / "one.json").read_text()) == {"faiss": 1, "loaded": [1]}
    default = json.loads((tmp_path / "default.json").read_text())
    assert default["loaded"] == sorted({p["num_threads"] for p in threadpool_info()}) and default["faiss"] > 0
    assert os.cpu_count() == 1 or max(default["loaded"]) > 1  # a budget that changes something


@pytest.mark.parametrize("call, status, text", [("'jobtargets:fail', log='job.log'", 1, "ValueError: a failing job"),
                                                ("'jobtargets:exit_with', 75, log='job.log'", 75, None)])
def test_the_job_exits_with_the_functions_status(server, tmp_path, call, status, text):
    job = _job(tmp_path, call)
    _, err = job.communicate(timeout=60)
    assert job.returncode == status
    if text:
        assert text in (tmp_path / "job.log").read_text()  # the traceback, as in-process (steplog.log_to)
        assert "job.log" in err


def test_without_a_server_the_job_runs_in_its_own_process(tmp_path, monkeypatch):
    (tmp_path / "jobtargets.py").write_text(TARGETS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delenv(jobserver.JOBSERVER_ENV, raising=False)
    job = _job(tmp_path, "'jobtargets:record', 'out.json', word='alone', log='job.log'")
    assert job.wait(timeout=60) == 0
    assert json.loads((tmp_path / "out.json").read_text())["pid"] == job.pid


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _child_pid(path: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the child did not start"
        time.sleep(0.1)
    return int(path.read_text())


@pytest.mark.parametrize("how, status", [("SIGTERM", 75), ("SIGKILL", -9)])
def test_a_cancelled_job_stops_its_child(server, tmp_path, how, status):
    job = _job(tmp_path, "'jobtargets:sleep_forever', 'pid.txt', log='job.log'")
    child = _child_pid(tmp_path / "pid.txt")
    job.send_signal(getattr(signal, how))  # SIGTERM goes on to the child; after SIGKILL the server sees the job gone
    assert job.wait(timeout=30) == status  # the child's status: its SIGTERM handler's exit 75
    assert _gone(child)


def test_the_server_exits_with_its_parent(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    starter = textwrap.dedent(f"""
        from dmlrepro import jobserver
        print(jobserver.start({str(folder)!r}, preload=()).pid, flush=True)
    """)
    pid = int(subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, check=True).stdout)
    assert _gone(pid)
    assert not (folder / "server.sock").exists()
