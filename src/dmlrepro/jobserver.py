"""A fork server for the local workflow's Python jobs (docs/workflow.md#job-server).

Every training job of the embedded default is a fresh interpreter that imports torch and torchvision
and tears them down again, which costs about as much CPU as the training itself
(docs/benchmarks.md#the-job-server-a-job-served-vs-in-its-own-interpreter).
With ``snakemake --cores N`` (local execution) the workflow starts one server that imports them once
(``PRELOAD``); a job's script then asks it to fork a child that runs the job's library function with
the script's working directory, environment and standard streams (passed as file descriptors), and
exits with the child's status. Forking copies the imported interpreter, nothing else: each run still
seeds and sets its threads itself, so results are bit-identical to an in-process run (tested).

* ``run_job(target, *args, log=..., threads=..., **kwargs)``: what a script calls; runs ``target`` in
  a server child when ``JOBSERVER_ENV`` names a live server, else in this process. Either way
  stdout/stderr go to ``log`` (with the traceback of a failure), the job's exit status is the
  function's, and every OpenMP and BLAS pool (faiss, scikit-learn, numpy) gets the job's ``threads``
  (``thread_budget``).
* ``start(folder)`` / ``stop(handle)``: the Snakefile's ``onstart`` / ``onsuccess`` / ``onerror``.
* ``run_job(..., gpu=n)``: the job's own ``n`` GPU slots (``dmlrepro.gpu_slots``), taken before the
  request (its environment carries ``CUDA_VISIBLE_DEVICES``); their lock files go to the child with
  the streams, so a slot is free only once both the job and its child have ended.

What a connection may ask is bounded (docs/workflow.md#job-server): a request is JSON (data, never
code), its target must be one of ``ENTRY_POINTS`` (the library functions the workflow's scripts
call), and the peer must run as the server's own user (``SO_PEERCRED``); anything else is refused
with one line and runs nothing. The temporary folder ``start`` makes is removed when the server
exits, with Snakemake or by ``stop``.

The server is one thread (forking from a multi-threaded process can deadlock the child): a loop over
the listening socket, the clients' connections and ``waitpid``. It never runs a torch operation, so
no thread pool exists when it forks. A child whose client dies (a cancelled job) gets SIGTERM; the
server exits when its parent (Snakemake) is gone. SLURM jobs run in-process: only local execution
starts a server.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlrepro import gpu_slots
from dmlrepro.run_failures import EXIT_INTERRUPTED
from dmlrepro.steplog import log_to

__all__ = ["ENTRY_POINTS", "JOBSERVER_ENV", "PRELOAD", "Server", "run_job", "start", "stop", "serve"]

JOBSERVER_ENV = "DMLREPRO_JOBSERVER"  # the server's socket path, set by `start` for the jobs
# what the jobs import (the first two are the costly imports); a module missing here only
# costs its import in each child that needs it
PRELOAD = (
    "torch",
    "torchvision",
    "dmlrepro.train.engine",
    "dmlrepro.tuning",
    "pytorch_metric_learning.losses",
    "sklearn.cluster",
    "dmlrepro.report.section_job",
    "dmlrepro.report.aggregate",
    "matplotlib.pyplot",
)
#: the only functions a server runs: those of workflow/scripts (rules train, search, prepare_dataset,
#: pretrain_digit_trunk, aggregate, report_section)
ENTRY_POINTS = frozenset(
    {
        "dmlrepro.train:train_run",
        "dmlrepro.tuning:run_search",
        "dmlrepro.data:prepare",
        "dmlrepro.models.digit_trunk:pretrain",
        "dmlrepro.report.aggregate:write_experiment_tables",
        "dmlrepro.report.section_job:write_section",
    }
)
MAX_SOCKET_PATH = 107  # bytes of a Unix socket path on Linux (sun_path holds 108, with its NUL)
CONNECT_WAIT_S = 120.0  # how long a job waits for a server that is still importing
_PID = struct.Struct("!i")  # the child's pid, sent when it starts; REFUSED, then a reason (_SIZE + UTF-8)
REFUSED = 0
_SIZE = struct.Struct("!Q")
MAX_GPU_LOCKS = 16  # the GPU slots' lock files a job may send after its 3 streams (its child keeps them open)
_RESULT = struct.Struct("!id")  # its exit status and CPU seconds (user + system, with its waited-for children)
child_cpu_seconds = 0.0  # the last served child's CPU time, for benchmarks/bench_default.py


# -- the job's side ------------------------------------------------------------------------------
def run_job(
    target: str, *args: Any, log: str | os.PathLike, threads: int | None = None, gpu: int = 0, **kwargs: Any
) -> None:
    """Run ``target`` (``"module:function"``) with ``args``/``kwargs``, its output in ``log``, its
    thread pools at ``threads`` (None: as they are), on ``gpu`` GPU slots of its own when the
    workflow hands them out (dmlrepro.gpu_slots: ``CUDA_VISIBLE_DEVICES`` names them); in a server
    child if one is up, else here. The arguments travel as JSON either way (paths as strings, tuples
    as lists), so the function sees the same values served or not. Exits the process with the
    child's status when it fails."""
    with gpu_slots.lease(gpu) as slots:  # waits for free slots; sets CUDA_VISIBLE_DEVICES before the request
        payload = encode_request(target, args, kwargs, log, threads)
        conn = _connect(os.environ.get(JOBSERVER_ENV))
        if conn is None:
            request = decode_request(payload)
            _call_logged(request["target"], request["args"], request["kwargs"], request["log"], request["threads"])
            return
        with conn:  # the child holds the slots' locks too: they are free once it and this process end
            status = _run_remote(conn, payload, slots.fds if slots else [])
    if status != 0:
        sys.exit(status)


def encode_request(target: str, args: tuple, kwargs: dict, log: str | os.PathLike, threads: int | None) -> bytes:
    """A request as JSON: the call, and this process's working directory, environment and argv."""
    request = {
        "target": target,
        "args": args,
        "kwargs": kwargs,
        "log": log,
        "threads": threads,
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "argv": sys.argv,
    }
    return json.dumps(request, default=_path_as_text).encode()


def _path_as_text(value: Any) -> str:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"dmlrepro job server: a job's arguments must be JSON data or paths, not {type(value).__name__}")


#: a request's keys and their JSON types
_REQUEST_TYPES = {
    "target": str,
    "args": list,
    "kwargs": dict,
    "log": str,
    "threads": (int, type(None)),
    "cwd": str,
    "environ": dict,
    "argv": list,
}


def decode_request(payload: bytes) -> dict[str, Any]:
    """The request in ``payload``; ValueError naming what is wrong with it."""
    try:
        request = json.loads(payload)
    except ValueError as e:  # not UTF-8, or not JSON
        raise ValueError(f"expected a JSON request ({e})") from None
    if not isinstance(request, dict) or set(request) != set(_REQUEST_TYPES):
        raise ValueError(f"expected a JSON object with the keys {', '.join(sorted(_REQUEST_TYPES))}")
    for key, types in _REQUEST_TYPES.items():
        if not isinstance(request[key], types) or isinstance(request[key], bool):
            raise ValueError(f"request key {key!r}: expected {types}, got {type(request[key]).__name__}")
    return request


def _connect(path: str | None) -> socket.socket | None:
    """A connection to the server at ``path``, waiting while it starts; None without a server."""
    if not path:
        return None
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except OSError:
            conn.close()
            if not _server_alive(path) or time.monotonic() > deadline:
                return None
            time.sleep(0.1)


def _server_alive(path: str) -> bool:
    """Whether the server named by the pid file beside ``path`` still runs: a server that exited but was not
    reaped yet (a zombie of Snakemake's) is dead too."""
    try:
        pid = int(Path(path).with_suffix(".pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no procfs (macOS): a zombie cannot be told apart
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the parenthesised command name


def _run_remote(conn: socket.socket, payload: bytes, locks: list[int]) -> int:
    """Send the request, this process's stdin/stdout/stderr and its GPU slots' ``locks``; forward
    SIGTERM/SIGINT to the child; return its exit status. A refusal exits with its reason."""
    global child_cpu_seconds
    child: list[int] = []  # its pid, once the server sends it; signals before that wait in `pending`
    pending: list[int] = []

    def forward(signum, frame):
        if child:
            os.kill(child[0], signum)
        else:
            pending.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)  # before the request: a signal while the child starts is not lost
    with contextlib.suppress(OSError):  # a server that refuses hangs up without reading: its answer is below
        socket.send_fds(conn, [_SIZE.pack(len(payload))], [0, 1, 2, *locks])
        conn.sendall(payload)
    try:
        (pid,) = _PID.unpack(_recv_exact(conn, _PID.size))
        if pid == REFUSED:
            (size,) = _SIZE.unpack(_recv_exact(conn, _SIZE.size))
            sys.exit(f"dmlrepro job server: refused: {_recv_exact(conn, size).decode()}")
    except OSError as e:
        sys.exit(
            f"dmlrepro job server: the server at {os.environ.get(JOBSERVER_ENV)} closed the connection "
            f"({e}); docs/workflow.md#job-server"
        )
    child.append(pid)
    for signum in pending:
        os.kill(pid, signum)
    status, child_cpu_seconds = _RESULT.unpack(_recv_exact(conn, _RESULT.size))
    return status


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the job server closed the connection")
        data += chunk
    return data


def _call_logged(
    target: str, args: list, kwargs: dict, log: str, threads: int | None, server: int | None = None
) -> None:
    module, _, name = target.partition(":")
    function: Callable = getattr(importlib.import_module(module), name)
    with log_to(log), thread_budget(threads), gpu_slots.announced():
        if server is not None:
            print(f"dmlrepro job server: forked from server {server} (docs/workflow.md#job-server)")
        try:
            function(*args, **kwargs)
        except Exception as error:  # a run stopped on a signal, its checkpoint written: exit 75, to be resumed
            if type(error).__name__ != "RunInterrupted":  # dmlrepro.train.preemption (torch: not imported here)
                raise
            print(error)
            raise SystemExit(EXIT_INTERRUPTED) from error


#: the variables an OpenMP or BLAS library reads when it loads
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def thread_budget(threads: int | None) -> Iterator[None]:
    """Every OpenMP and BLAS pool at most ``threads`` wide while the job runs: those loaded already
    (threadpoolctl) and those a later import loads (the variables above). Two jobs share the local
    machine's cores, and a pool wider than its job's share spins on a busy core (the t-SNE figures:
    docs/benchmarks.md#thread-budget-the-stand-in-first-table-iv-without-nmi-cpu). torch's own threads are the run's
    (``threads`` of its config); the metrics are the same on any number (tests/workflow)."""
    if threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits  # deferred: only a job with a budget needs it

    os.environ.update({name: str(threads) for name in THREAD_VARIABLES})
    with threadpool_limits(limits=threads):
        yield


# -- the server's side ---------------------------------------------------------------------------
@dataclass
class Server:
    """A started server: its process and folder (``temporary``: made by ``start``, removed at exit)."""

    process: subprocess.Popen
    folder: Path
    temporary: bool

    @property
    def pid(self) -> int:
        return self.process.pid


def start(
    folder: str | os.PathLike | None = None,
    preload: tuple[str, ...] = PRELOAD,
    entry_points: Collection[str] = ENTRY_POINTS,
) -> Server:
    """Start a server (it imports ``preload`` first, then runs only ``entry_points``) and name its
    socket in ``JOBSERVER_ENV`` for the jobs this process starts; jobs that start before it listens
    wait for it. Without ``folder`` it lives in a new temporary folder that it removes when it exits."""
    temporary = folder is None
    folder = Path(_short_temporary_folder() if temporary else folder)
    path = folder / "server.sock"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"job server socket {path}: longer than a Unix socket path may be ({MAX_SOCKET_PATH} bytes)")
    options = {
        "path": str(path),
        "parent": os.getpid(),
        "preload": list(preload),
        "entry_points": sorted(entry_points),
        "remove": str(folder) if temporary else None,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "dmlrepro.jobserver", json.dumps(options)], stdin=subprocess.DEVNULL
    )
    path.with_suffix(".pid").write_text(str(process.pid))
    os.environ[JOBSERVER_ENV] = str(path)
    return Server(process, folder, temporary)


def _short_temporary_folder() -> str:
    """A new temporary folder whose socket path fits a Unix socket address: under $TMPDIR where it is short
    enough, else under /tmp (a long $TMPDIR made bind fail and every job wait for a server that had died)."""
    folder = tempfile.mkdtemp(prefix="dmlrepro-jobs-")
    if len(os.fsencode(Path(folder) / "server.sock")) <= MAX_SOCKET_PATH:
        return folder
    os.rmdir(folder)
    return tempfile.mkdtemp(prefix="dmlrepro-jobs-", dir="/tmp")


def stop(server: Server) -> None:
    """Stop the server (its children, if any, finish on their own) and remove its temporary folder."""
    os.environ.pop(JOBSERVER_ENV, None)
    server.process.terminate()
    server.process.wait()
    if server.temporary:  # the server removes it itself, unless it was killed
        shutil.rmtree(server.folder, ignore_errors=True)


def serve(
    path: str,
    parent: int,
    preload: tuple[str, ...] = (),
    entry_points: Collection[str] = ENTRY_POINTS,
    remove: str | None = None,
) -> None:
    """Import ``preload``, listen at ``path`` and fork a child per accepted request until SIGTERM or
    until the process ``parent`` (the one that started this server) is gone; then remove the socket,
    or the whole folder ``remove``."""
    for module in preload:
        importlib.import_module(module)
    Path(path).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    running: dict[socket.socket, int] = {}  # client connection -> child pid
    cancelled: list[int] = []  # children of clients that went away, still to be reaped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        while os.getppid() == parent:
            readable, _, _ = select.select([listener, *running], [], [], 0.2)
            for conn in readable:
                if conn is listener:
                    _accept(listener, running, frozenset(entry_points))
                else:  # a client wrote or went away before its child ended: a cancelled job
                    cancelled.append(running.pop(conn))
                    os.kill(cancelled[-1], signal.SIGTERM)
                    conn.close()
            _reap(running)
            cancelled = [pid for pid in cancelled if not os.waitpid(pid, os.WNOHANG)[0]]
    finally:
        listener.close()
        Path(path).unlink(missing_ok=True)
        Path(path).with_suffix(".pid").unlink(missing_ok=True)
        if remove:
            shutil.rmtree(remove, ignore_errors=True)


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED: pid, uid, gid)."""
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid


def _accept(listener: socket.socket, running: dict[socket.socket, int], entry_points: frozenset[str]) -> None:
    conn, _ = listener.accept()
    uid = peer_uid(conn)
    if uid != os.getuid():  # before reading anything: another user's process gets nothing
        _refuse(conn, f"a connection from uid {uid}: this server serves uid {os.getuid()} only")
        return
    fds: list[int] = []
    try:
        header, fds, _, _ = socket.recv_fds(conn, _SIZE.size, 3 + MAX_GPU_LOCKS)
        request = decode_request(_recv_exact(conn, _SIZE.unpack(header)[0]))
        if request["target"] not in entry_points:
            raise ValueError(f"{request['target']!r} is not a job entry point (dmlrepro.jobserver.ENTRY_POINTS)")
        if len(fds) < 3:
            raise ValueError(
                f"expected the job's 3 standard streams (then its GPU slots' locks), got {len(fds)} descriptors"
            )
    except (OSError, ValueError, struct.error) as e:  # json's JSONDecodeError is a ValueError
        for fd in fds:
            os.close(fd)
        _refuse(conn, str(e))
        return
    sys.stdout.flush()  # nothing buffered here may reach a child's streams
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns
        _child(request, fds, (listener, *running))
    for fd in fds:
        os.close(fd)
    conn.sendall(_PID.pack(pid))
    running[conn] = pid


def _refuse(conn: socket.socket, reason: str) -> None:
    """Tell the client why its request runs nothing (in the server's log too), and hang up."""
    print(f"dmlrepro job server: refused {reason}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        text = reason.encode()
        conn.sendall(_PID.pack(REFUSED) + _SIZE.pack(len(text)) + text)
    conn.close()


def _child(request: dict[str, Any], fds: list[int], server_sockets: tuple[socket.socket, ...]) -> None:
    status = 1
    try:
        for other in server_sockets:
            other.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        for fd, std in zip(fds, (0, 1, 2)):  # fds[3:], the GPU slots' locks, stay open until the child exits
            os.dup2(fd, std)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["environ"])
        sys.argv = request["argv"]
        _call_logged(
            request["target"],
            request["args"],
            request["kwargs"],
            request["log"],
            request["threads"],
            server=os.getppid(),
        )
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else 1
    except BaseException:  # the traceback is in the log (steplog.log_to)
        print(f"dmlrepro job server: {request['target']} failed; see {request['log']}", file=sys.stderr)
    finally:  # what an interpreter's exit does, less the teardown of its modules (slow with torch loaded)
        atexit._run_exitfuncs()  # e.g. multiprocessing's: stops persistent DataLoader workers
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _reap(running: dict[socket.socket, int]) -> None:
    """Send each ended child's exit status to its client."""
    for conn, pid in list(running.items()):
        done, wait_status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            del running[conn]
            try:
                code = os.waitstatus_to_exitcode(wait_status)  # -N: killed by signal N
                conn.sendall(_RESULT.pack(code if code >= 0 else 128 - code, usage.ru_utime + usage.ru_stime))
            except OSError:
                pass
            conn.close()


if __name__ == "__main__":
    from dmlrepro import jobserver  # the module itself, not this __main__ copy: what a preloaded module sees

    jobserver.serve(**json.loads(sys.argv[1]))
