"""Fault-injection harness: ``dmlrepro train`` in processes that can be SIGKILLed, and where each
kill landed.

Two kinds of training process are killed at random times (tests/faults/test_fault_injection.py):

* ``cli``: ``python -m dmlrepro.cli train RUN_CONFIG OUTDIR`` in its own interpreter (the
  ``dmlrepro`` console script's ``main``);
* ``served``: a job of the workflow's job server (``dmlrepro.jobserver``, started as the Snakefile
  starts it), handed over by a client process through ``run_job("dmlrepro.train:train_run", ...)``
  as ``workflow/scripts/train.py`` does; the server forks the child that trains.

Both run with ``phase_marker/`` on PYTHONPATH: its sitecustomize records in a small shared file
(:class:`Marker`) the phase each process is in and, with the process's own timestamps, every change
of phase. The kill itself is a plain ``SIGKILL`` sent by the test at a time it drew; the phase left
in the marker is where the process died.

:class:`ForkServer` (the half-written-files test) forks ``train_main(argv)`` children from a small
server that has imported torch and the engine, so that the many short runs of that test start in
milliseconds; its children carry the engine's test-only kill hooks.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

RUNNING = -1000
#: lines of the fault-injection summary (filled by the tests, printed at the end of the session)
SUMMARY: list[str] = []
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MARKER_SITE = HERE / "phase_marker"
_spec = importlib.util.spec_from_file_location("fault_phase_marker", MARKER_SITE / "sitecustomize.py")
marker_layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(marker_layout)  # the layout only: ENV is not set in the test process
PHASES = marker_layout.PHASES


# -- the phase marker ----------------------------------------------------------------------------
def marker_env(path: Path | None) -> dict[str, str]:
    """What a process needs in its environment to record its phases in ``path`` (None: a job
    server, whose children get their own path from their clients)."""
    pythonpath = os.pathsep.join(p for p in (str(MARKER_SITE), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": pythonpath, marker_layout.ENV: "" if path is None else str(path)}


class Marker:
    """The test's view of one process's marker file (created empty here, before the process starts)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.write_bytes(bytes(marker_layout.SIZE))
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self.mm = mmap.mmap(fd, marker_layout.SIZE, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)

    @property
    def phase(self) -> str:
        return PHASES[marker_layout.HEADER.unpack_from(self.mm, 0)[0]]

    @property
    def pid(self) -> int:
        return marker_layout.HEADER.unpack_from(self.mm, 0)[1]

    @property
    def count(self) -> int:
        return marker_layout.HEADER.unpack_from(self.mm, 0)[2]

    def event(self, i: int) -> tuple[str, float]:
        """The i-th change of phase: the phase entered and when (time.monotonic of the process)."""
        offset = marker_layout.HEADER.size + i * marker_layout.EVENT.size
        code, _, when = marker_layout.EVENT.unpack_from(self.mm, offset)
        return PHASES[code], when

    def events(self) -> list[tuple[str, float]]:
        return [self.event(i) for i in range(self.count)]


def phase_windows(events: Sequence[tuple[str, float]]) -> list[tuple[int, str, float]]:
    """Each event's window: (event index, phase, seconds until the next change of phase)."""
    return [(i, phase, events[i + 1][1] - when) for i, (phase, when) in enumerate(events[:-1])]


# -- the processes that are killed ---------------------------------------------------------------
def _thread_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLREPRO_TEST_")}
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return env


class Job:
    """One training process under test: a ``dmlrepro train`` process, or the client of a served job."""

    def __init__(self, proc: subprocess.Popen, marker: Marker, log_path: Path, served: bool):
        self.proc, self.marker, self.log_path, self.served = proc, marker, Path(log_path), served

    @property
    def pid(self) -> int:
        """The training process: the CLI process, or the server's child (it names itself in the marker)."""
        return self.marker.pid if self.served else self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 300) -> int:
        """The training process's exit status, -N when signal N ended it (a served job's client
        exits with 128 + N: the job server's convention)."""
        code = self.proc.wait(timeout)
        return 128 - code if self.served and code > 128 else code

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""


def start_cli(conf: Path, out: Path, log_path: Path, marker: Marker) -> Job:
    """``python -m dmlrepro.cli train CONF OUT --no-progress``, its output in ``log_path``."""
    with open(log_path, "a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dmlrepro.cli", "train", str(conf), str(out), "--no-progress"],
            cwd=REPO,
            env={**_thread_env(), **marker_env(marker.path)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return Job(proc, marker, log_path, served=False)


#: the client of a served job: what workflow/scripts/train.py does with Snakemake's values
_CLIENT = (
    "import sys, yaml; from dmlrepro.jobserver import run_job; "
    "run_job('dmlrepro.train:train_run', yaml.safe_load(open(sys.argv[1])), sys.argv[2], progress=False, "
    "log=sys.argv[3])"
)


class JobServer:
    """The workflow's job server (``dmlrepro.jobserver.start``, its default preload) with the phase
    marker on its PYTHONPATH; ``submit`` hands it a training job."""

    def __init__(self):
        from dmlrepro import jobserver

        self._jobserver = jobserver
        saved = {k: os.environ.get(k) for k in ("PYTHONPATH", marker_layout.ENV, jobserver.JOBSERVER_ENV)}
        os.environ.update(marker_env(None))
        try:
            self.server = jobserver.start()  # as the Snakefile's onstart
            self.socket = os.environ[jobserver.JOBSERVER_ENV]
        finally:  # the test process's own environment is left as it was
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def submit(self, conf: Path, out: Path, log_path: Path, marker: Marker) -> Job:
        environ = {**_thread_env(), **marker_env(marker.path), self._jobserver.JOBSERVER_ENV: self.socket}
        proc = subprocess.Popen(
            [sys.executable, "-c", _CLIENT, str(conf), str(out), str(log_path)],
            cwd=REPO,
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return Job(proc, marker, log_path, served=True)

    def close(self) -> None:
        self._jobserver.stop(self.server)


def kill_in_window(job: Job, anchor: int, offset: float, timeout: float = 300) -> float | None:
    """SIGKILL ``job`` ``offset`` seconds after its change of phase number ``anchor`` (by the
    process's own clock); how late the signal went out (seconds), None when the job ended first."""
    end = time.monotonic() + timeout
    while job.marker.count <= anchor:
        if not job.alive():
            return None
        if time.monotonic() > end:
            raise TimeoutError(f"dmlrepro train never reached its change of phase {anchor}; log: {job.log_path}")
        time.sleep(0.001)
    due = job.marker.event(anchor)[1] + offset
    while (left := due - time.monotonic()) > 0:
        time.sleep(min(left, 0.001))
    if not job.alive():
        return None
    sent = time.monotonic()
    try:
        os.kill(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return sent - due


# -- the fork server of the half-written-files test ----------------------------------------------
def _run_child(job: dict) -> None:
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    for k in [k for k in os.environ if k.startswith("DMLREPRO_TEST_")]:
        del os.environ[k]
    os.environ.update(job["env"])  # the test hooks are read when the run starts
    from dmlrepro.train.cli import train_main

    code = train_main(job["argv"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
    """Read one JSON job per stdin line, fork a child for it, answer its pid on stdout; write each
    child's exit status (the exit code, or -signal) into its job's status file when it ends."""
    import logging

    import torch  # noqa: F401
    import torch._inductor.config  # noqa: F401  (what use_deterministic_algorithms imports)

    import dmlrepro.evaluation  # noqa: F401
    import dmlrepro.losses  # noqa: F401
    import dmlrepro.train.cli  # noqa: F401
    import dmlrepro.train.engine  # noqa: F401

    logging.basicConfig(level=logging.WARNING)  # as the CLI's main() does
    slots: dict[int, str] = {}

    def reap(*_):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            path = slots.pop(pid, None)
            if path:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                with open(path, "r+b") as fh:
                    fh.write(struct.pack("<i", code))

    signal.signal(signal.SIGCHLD, reap)
    print("ready", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
            try:
                _run_child(job)
            finally:
                os._exit(70)
        slots[pid] = job["status"]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        print(pid, flush=True)


class ForkServer:
    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.count = 0
        env = {**_thread_env(), "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import fault_harness; fault_harness.serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"fault-harness server did not start ({ready!r})")

    def start(self, argv: Sequence[str], log_path, env: dict | None = None) -> Child:
        self.count += 1
        status = self.workdir / f"status{self.count}"
        status.write_bytes(struct.pack("<i", RUNNING))
        self.proc.stdin.write(
            json.dumps(
                {"argv": list(map(str, argv)), "env": dict(env or {}), "log": str(log_path), "status": str(status)}
            )
            + "\n"
        )
        self.proc.stdin.flush()
        pid = int(self.proc.stdout.readline())
        return Child(pid, status, log_path)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


class Child:
    """One ``dmlrepro train`` process forked by the server."""

    def __init__(self, pid: int, status: Path, log_path):
        self.pid, self.status_path, self.log_path = pid, Path(status), str(log_path)

    @property
    def status(self) -> int:
        return struct.unpack("<i", self.status_path.read_bytes())[0]

    def alive(self) -> bool:
        return self.status == RUNNING

    def wait(self, timeout: float = 300) -> int:
        end = time.perf_counter() + timeout
        while self.alive():
            if time.perf_counter() > end:
                os.kill(self.pid, signal.SIGKILL)
                raise TimeoutError(f"dmlrepro train did not end in {timeout} s; log: {self.log_path}")
            time.sleep(0.005)
        return self.status

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
