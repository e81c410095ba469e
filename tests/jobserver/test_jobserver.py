"""dmlrepro.jobserver: a job's function runs in a fork of the server, with the job's working
directory, environment, streams and log; its exit status is the job's; a cancelled job's child is
stopped; without a server the job runs in its own process (tests/train/test_served_run.py: a
training run through the server is bit-identical to one in-process). The server runs only its entry
points, for its own user, from JSON requests, and leaves no folder behind."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dmlrepro import jobserver

TARGETS = """
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
def unlisted(path):  # importable by the server, but not one of its entry points
    open(path, "w").close()
def sleep_forever(path):  # as the engine does: SIGTERM -> a checkpoint, then RunInterrupted (exit 75, retry)
    from dmlrepro.train.preemption import RunInterrupted
    def stop(signum, frame):
        raise RunInterrupted(signum, "ckpt.pt")
    signal.signal(signal.SIGTERM, stop)
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
"""

#: the test targets a test server runs (not `unlisted`)
TEST_ENTRY_POINTS = {f"jobtargets:{name}" for name in ("record", "fail", "exit_with", "pools", "sleep_forever")}
REPO = Path(__file__).resolve().parents[2]


def _serve(tmp_path, monkeypatch, preload=("jobtargets", "numpy"), entry_points=TEST_ENTRY_POINTS):
    (tmp_path / "jobtargets.py").write_text(TARGETS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "server").mkdir()
    return jobserver.start(tmp_path / "server", preload=preload, entry_points=entry_points)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A server (preloading the test targets' module) for jobs started from this test."""
    handle = _serve(tmp_path, monkeypatch)
    yield handle
    jobserver.stop(handle)


def _job(tmp_path, call: str, env=None, **popen) -> subprocess.Popen:
    """A job process (what a workflow script is) that calls run_job."""
    code = f"from dmlrepro.jobserver import run_job; run_job({call})"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


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
def test_a_jobs_thread_pools_are_its_threads_and_the_next_jobs_are_as_they_were(server, tmp_path, monkeypatch, served):
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


@pytest.mark.parametrize(
    "call, status, text",
    [
        ("'jobtargets:fail', log='job.log'", 1, "ValueError: a failing job"),
        ("'jobtargets:exit_with', 75, log='job.log'", 75, None),
    ],
)
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


@pytest.mark.parametrize("served", [True, False])
def test_a_run_stopped_on_sigterm_exits_75_and_is_no_failure(tmp_path, monkeypatch, served):
    """The engine's RunInterrupted (checkpoint written) becomes exit 75, served or not, and the workflow's
    failure record (dmlrepro.run_failures) stays unwritten: the run resumes, it did not fail."""
    handle = _serve(tmp_path, monkeypatch) if served else None
    if not served:
        (tmp_path / "jobtargets.py").write_text(TARGETS)
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
        monkeypatch.delenv(jobserver.JOBSERVER_ENV, raising=False)
    code = (
        "from dmlrepro.jobserver import run_job\nfrom dmlrepro.run_failures import recorded_failure\n"
        "with recorded_failure('failed.json', 'job.log'):\n"
        "    run_job('jobtargets:sleep_forever', 'pid.txt', log='job.log')"
    )
    job = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        _child_pid(tmp_path / "pid.txt")
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=30) == 75, job.stderr.read()
        assert not (tmp_path / "failed.json").exists()
        assert "stopped on SIGTERM; checkpoint ckpt.pt" in (tmp_path / "job.log").read_text()
    finally:
        if handle is not None:
            jobserver.stop(handle)


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


def test_the_server_exits_with_its_parent_and_removes_its_folder(tmp_path):
    """What happens when Snakemake ends without its onsuccess/onerror (killed): the server sees its
    parent gone, exits, and removes the temporary folder it lived in."""
    starter = textwrap.dedent("""
        from dmlrepro import jobserver
        server = jobserver.start(preload=())
        print(server.pid, server.folder, flush=True)
    """)
    done = subprocess.run(
        [sys.executable, "-c", starter],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    pid, folder = done.stdout.split()
    assert Path(folder).parent == tmp_path and Path(folder).name.startswith("dmlrepro-jobs-")
    assert _gone(int(pid))
    assert list(tmp_path.iterdir()) == []


def test_stop_removes_the_temporary_folder_and_leaves_a_given_one(tmp_path, monkeypatch):
    """The workflow's onstart starts a server in a new temporary folder, its onsuccess/onerror stop it
    (workflow/rules/common.smk, end_of_workflow): nothing is left in the temporary directory."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    handle = jobserver.start(preload=())
    assert handle.temporary and handle.folder.parent == tmp_path and handle.folder.is_dir()
    jobserver.stop(handle)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "given").mkdir()
    jobserver.stop(jobserver.start(tmp_path / "given", preload=()))
    assert [p.name for p in tmp_path.iterdir()] == ["given"]


# -- what a connection may ask -------------------------------------------------------------------


def test_the_entry_points_are_the_functions_the_workflow_scripts_hand_over():
    called = {
        m.group(1)
        for script in (REPO / "workflow/scripts").glob("*.py")
        for m in re.finditer(r'run_job\(\s*"([\w.]+:\w+)"', script.read_text())
    }
    assert called == jobserver.ENTRY_POINTS
    for target in called:  # each names a function that exists
        module, _, name = target.partition(":")
        assert callable(getattr(__import__(module, fromlist=[name]), name)), target


@pytest.mark.parametrize(
    "call",
    [
        "'os:system', 'touch pwned', log='job.log'",
        "'jobtargets:unlisted', 'pwned', log='job.log'",
        "'subprocess:run', ['touch', 'pwned'], log='job.log'",
    ],
)
def test_a_request_naming_another_function_is_refused(server, tmp_path, call):
    job = _job(tmp_path, call)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 1
    assert err.strip().splitlines() == [err.strip()] and "is not a job entry point" in err
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "job.log").exists()


def test_the_projects_entry_points_are_all_a_default_server_runs(tmp_path, monkeypatch):
    handle = _serve(tmp_path, monkeypatch, preload=("jobtargets",), entry_points=jobserver.ENTRY_POINTS)
    try:
        job = _job(tmp_path, "'jobtargets:record', 'out.json', word='w', log='job.log'")
        _, err = job.communicate(timeout=60)
    finally:
        jobserver.stop(handle)
    assert job.returncode == 1 and "'jobtargets:record' is not a job entry point" in err
    assert not (tmp_path / "out.json").exists()


class _Executes:
    """A pickle that runs code when loaded: what the server must never load."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _raw_request(path: str, payload: bytes) -> bytes:
    """Send ``payload`` as a job would (with its 3 standard streams); the server's answer."""
    with jobserver._connect(path) as conn:  # waits while the server starts
        socket.send_fds(conn, [len(payload).to_bytes(8, "big")], [0, 1, 2])
        conn.sendall(payload)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    return answer


@pytest.mark.parametrize("kind", ["pickle", "not an object", "a missing key"])
def test_a_request_that_is_not_the_json_request_runs_nothing(server, tmp_path, kind):
    payload = {
        "pickle": pickle.dumps(_Executes(tmp_path / "pwned")),
        "not an object": b'["jobtargets:record"]',
        "a missing key": json.dumps(
            {
                "target": "jobtargets:record",
                "args": [str(tmp_path / "pwned")],
                "kwargs": {},
                "log": str(tmp_path / "job.log"),
            }
        ).encode(),
    }[kind]
    socket_path = os.environ[jobserver.JOBSERVER_ENV]
    answer = _raw_request(socket_path, payload)
    assert answer[:4] == jobserver.REFUSED.to_bytes(4, "big")
    assert re.search(rb"expected a JSON (request|object with the keys)", answer[12:]), answer
    time.sleep(0.5)  # a child, had one been forked, has run by now
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "job.log").exists()


def test_the_peer_uid_is_read_from_the_socket():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert jobserver.peer_uid(left) == os.getuid()


FAKE_PEER = """
import os
from dmlrepro import jobserver
jobserver.peer_uid = lambda conn: os.getuid() + 1  # every connection seems to come from another user
"""


def test_a_connection_from_another_uid_is_refused(tmp_path, monkeypatch):
    """The credential check's seam (jobserver.peer_uid, replaced by a module the server preloads)
    makes every client another user: nothing runs, the client exits with one line."""
    (tmp_path / "fakepeer.py").write_text(FAKE_PEER)
    handle = _serve(tmp_path, monkeypatch, preload=("jobtargets", "fakepeer"))
    try:
        job = _job(tmp_path, "'jobtargets:record', 'out.json', word='w', log='job.log'")
        _, err = job.communicate(timeout=60)
    finally:
        jobserver.stop(handle)
    assert job.returncode == 1 and f"a connection from uid {os.getuid() + 1}" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "job.log").exists()


def test_arguments_travel_as_json_served_or_not(server, tmp_path, monkeypatch):
    """Paths arrive as strings and tuples as lists, in a server child and in-process alike; an
    argument JSON cannot carry is an error before anything runs."""
    for served in (True, False):
        if not served:
            monkeypatch.delenv(jobserver.JOBSERVER_ENV)
        job = _job(
            tmp_path, "'jobtargets:record', __import__('pathlib').Path('out.json'), word=('a', 1), log='job.log'"
        )
        assert job.wait(timeout=60) == 0
        assert json.loads((tmp_path / "out.json").read_text())["word"] == ["a", 1]
    job = _job(tmp_path, "'jobtargets:record', 'out.json', word={1j}, log='job.log'")
    _, err = job.communicate(timeout=60)
    assert job.returncode == 1 and "must be JSON data or paths, not set" in err


# -- a server that cannot serve --------------------------------------------------------------------


def test_a_long_temporary_directory_still_gives_a_server_jobs_reach(tmp_path, monkeypatch):
    """A socket path past the Unix limit made bind fail: the server died at start and every job waited
    CONNECT_WAIT_S for it (seen under pytest-xdist's longer temporary paths). The folder moves to /tmp."""
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(deep))
    handle = jobserver.start(preload=())
    try:
        path = handle.folder / "server.sock"
        assert len(os.fsencode(path)) <= jobserver.MAX_SOCKET_PATH
        conn = jobserver._connect(str(path))
        assert conn is not None
        conn.close()
    finally:
        jobserver.stop(handle)
    with pytest.raises(ValueError, match="longer than a Unix socket path"):
        jobserver.start(deep, preload=())


def test_a_job_does_not_wait_for_a_server_that_died(tmp_path, monkeypatch):
    """A server that exited while its parent (Snakemake) has not reaped it is a zombie: the job runs in
    its own process at once instead of waiting CONNECT_WAIT_S for it."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{dead.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (tmp_path / "server.pid").write_text(str(dead.pid))  # a zombie: kill(pid, 0) still succeeds
    waits = []
    monkeypatch.setattr(jobserver.time, "sleep", waits.append)
    assert jobserver._connect(str(tmp_path / "server.sock")) is None
    assert waits == []  # not one wait for it
    dead.wait()
