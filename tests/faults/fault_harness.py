"""Fault-injection harness: run ``dmlrepro train`` in processes that can be SIGKILLed at random
points, and tell in which phase of the run each kill landed.

Each trained process is the CLI's ``train_main(argv)`` in a child forked from a small *fork
server* (a fresh interpreter that has imported torch, the engine and the losses once and run no
torch computation, so no thread pools exist when it forks): a child starts in milliseconds
instead of the ~7 s a fresh interpreter spends importing, so dozens of kills fit in the test
budget. The child is a separate process with its own memory and files; ``SIGKILL`` ends it
exactly as it ends a fresh ``dmlrepro train`` (the tests also kill a real CLI subprocess, and
check that a forked child's results equal a fresh process's).

Each child has a small shared file (mmap): int32 ``phase`` (a wrapper around the engine's
methods sets it, so after a SIGKILL the value left there is where the process died) and int32
``status`` (written by the server when it reaps the child: the exit code, or ``-signal``).
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

PHASES = ("startup", "setup", "resume", "data", "step", "evaluate", "checkpoint", "log", "finish", "exit")
RUNNING = -1000
#: lines of the fault-injection summary (filled by the tests, printed at the end of the session)
SUMMARY: list[str] = []
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


# -- in the child --------------------------------------------------------------------------------
class _Slot:
    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR)
        self.mm = mmap.mmap(fd, 8)
        os.close(fd)

    @property
    def value(self) -> int:
        return struct.unpack_from("<i", self.mm, 0)[0]

    @value.setter
    def value(self, v: int) -> None:
        struct.pack_into("<i", self.mm, 0, v)


def _traced(slot: _Slot, name: str, fn):
    code = PHASES.index(name)

    def wrapper(*args, **kwargs):
        prev = slot.value
        slot.value = code
        try:
            return fn(*args, **kwargs)
        finally:
            slot.value = prev

    return wrapper


def _install_tracer(slot: _Slot) -> None:
    from dmlrepro.train import checkpoint, engine

    t = engine._Trainer
    t.__init__ = _traced(slot, "setup", t.__init__)
    engine.load_latest = _traced(slot, "resume", engine.load_latest)
    t._train_epoch = _traced(slot, "data", t._train_epoch)  # what is left of an epoch: the DataLoader
    t._step = _traced(slot, "step", t._step)
    t._evaluate = _traced(slot, "evaluate", t._evaluate)
    t._write_log = _traced(slot, "log", t._write_log)
    t._finish_completed = _traced(slot, "finish", t._finish_completed)
    checkpoint.write_verified = _traced(slot, "checkpoint", checkpoint.write_verified)  # save_checkpoint
    engine.write_verified = checkpoint.write_verified  # best_model.pt


def _run_child(job: dict) -> None:
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    for k in [k for k in os.environ if k.startswith("DMLREPRO_TEST_")]:
        del os.environ[k]
    os.environ.update(job["env"])  # the test hooks are read when the run starts
    slot = _Slot(job["slot"])
    _install_tracer(slot)
    from dmlrepro.train.cli import train_main

    code = train_main(job["argv"])
    slot.value = PHASES.index("exit")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- the server ----------------------------------------------------------------------------------
def serve() -> None:
    """Read one JSON job per stdin line, fork a child for it, answer its pid on stdout."""
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
                    fh.seek(4)
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
        slots[pid] = job["slot"]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        print(pid, flush=True)


# -- in the test process -------------------------------------------------------------------------
class ForkServer:
    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.count = 0
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        env = {k: v for k, v in env.items() if not k.startswith("DMLREPRO_TEST_")}
        self.proc = subprocess.Popen([sys.executable, "-c", "import fault_harness; fault_harness.serve()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"fault-harness server did not start ({ready!r})")

    def start(self, argv: Sequence[str], log_path, env: dict | None = None) -> "Child":
        self.count += 1
        slot = self.workdir / f"slot{self.count}"
        slot.write_bytes(struct.pack("<ii", 0, RUNNING))
        self.proc.stdin.write(json.dumps({"argv": list(map(str, argv)), "env": dict(env or {}),
                                          "log": str(log_path), "slot": str(slot)}) + "\n")
        self.proc.stdin.flush()
        pid = int(self.proc.stdout.readline())
        return Child(pid, slot, log_path)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


class Child:
    """One ``dmlrepro train`` process forked by the server."""

    def __init__(self, pid: int, slot: Path, log_path):
        self.pid, self.log_path = pid, str(log_path)
        self.slot = _Slot(str(slot))
        self.started = time.perf_counter()

    @property
    def phase(self) -> str:
        return PHASES[self.slot.value]

    @property
    def status(self) -> int:
        return struct.unpack_from("<i", self.slot.mm, 4)[0]

    def alive(self) -> bool:
        return self.status == RUNNING

    def kill(self) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float = 300) -> int:
        end = time.perf_counter() + timeout
        while self.alive():
            if time.perf_counter() > end:
                self.kill()
                raise TimeoutError(f"dmlrepro train did not end in {timeout} s; log: {self.log_path}")
            time.sleep(0.005)
        self.seconds = time.perf_counter() - self.started
        return self.status

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()


def wait_for_phase(child: Child, phases: Sequence[str], timeout: float = 120) -> bool:
    """Spin until the child is in one of ``phases`` (True) or has ended (False)."""
    codes = {PHASES.index(p) for p in phases}
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        if child.slot.value in codes:
            return True
        if not child.alive():
            return False
        time.sleep(0)  # phases such as a checkpoint write last milliseconds
    raise TimeoutError(f"the run never reached {phases}")
