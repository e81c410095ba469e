"""Shapes measured in a separate process: a shape that hangs past its time limit, or whose process
dies (out of memory, a crash in native code), is a failed shape with that reason, and the next
shape gets a fresh process. The process (``python -m dmlrepro.preflight.worker``: a fresh
interpreter, which neither inherits the parent's threads and CUDA state nor re-runs the parent's
main script, e.g. a Snakemake rule's) is started once and serves shape after shape over a socket."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import Any

from .stepping import Measurement, measure_shape


def _serve(conn: Connection) -> None:
    """The child: say it is ready (torch imported), then measure each (config, steps) received and
    send back its Measurement."""
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(measure_shape(*job))


class ShapeWorker:
    """``measure(cfg, steps)`` in a child process, at most ``timeout`` seconds a shape."""

    def __init__(self, timeout: float, memory_bytes: int | None = None):
        """``memory_bytes``: a cap on the child's data memory (``RLIMIT_DATA``), so that a shape too
        large for a CPU node fails with an allocation error instead of waking the kernel's OOM killer."""
        self.timeout, self.memory_bytes, self.process, self.conn = float(timeout), memory_bytes, None, None

    def __enter__(self) -> ShapeWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dmlrepro.preflight.worker", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            preexec_fn=self._limit,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.recv()  # "ready": start-up does not count against a shape's time

    def _limit(self) -> None:
        if self.memory_bytes:
            resource.setrlimit(resource.RLIMIT_DATA, (self.memory_bytes, self.memory_bytes))

    def measure(self, cfg: dict[str, Any], steps: int) -> Measurement:
        if self.process is None or self.process.poll() is not None:
            self._start()
        self.conn.send((cfg, steps))
        if self.conn.poll(self.timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass  # the child died mid-shape
        else:
            self._stop()
            return Measurement(
                status="failed",
                error=f"TimeoutError: no result within {self.timeout:g} s "
                f"(--shape-timeout); the shape's process was stopped",
            )
        code = self.process.wait(timeout=60)
        self._stop()
        reason = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        hint = " (SIGKILL: out of memory?)" if code == -9 else ""
        return Measurement(status="failed", error=f"ChildProcessError: the shape's process died: {reason}{hint}")

    def _stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=60)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.conn.send(None)
                self.process.wait(timeout=30)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self._stop()


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), None elsewhere."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
