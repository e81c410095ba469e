"""One process at a time per run directory: an ``flock`` on ``<run>/.lock``, or an exclusive
lock file (``pid host``) where the filesystem has no flock (docs/training.md#signals-and-locks)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from pathlib import Path

from .outputs import say as _say
from .state import LOCK_PID_FILE, RunDir


@contextlib.contextmanager
def run_lock(outdir: Path):
    """One process at a time per run directory (``<outdir>/.lock``, an ``flock`` the kernel
    releases when its holder dies, even by SIGKILL). When the Snakemake controller is killed, its
    train jobs live on as orphans and a rerun starts a second trainer on the same folder, which
    would delete the first one's checkpoint temporaries: the second one waits for the first, then
    finds its finished run."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(RunDir(outdir).lock, os.O_RDWR | os.O_CREAT, 0o644)  # beside, not in, checkpoints/
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            _say(f"{outdir} is being trained by another process (pid {holder}); waiting for it to end")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in _NO_FLOCK:
                raise
            _say(f"{outdir}: flock is not supported here ({error.strerror}); using the lock file {LOCK_PID_FILE}")
            with lock_file(RunDir(outdir).lock_pid):
                yield
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


#: flock errors of filesystems without flock support (Lustre without ``-o flock``, some NFS)
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@contextlib.contextmanager
def lock_file(path: Path, poll: float = 5.0):
    """An exclusive lock file (``O_CREAT | O_EXCL``) holding ``pid host``, removed on exit. A file
    left by a dead process of this host is stale and taken over; one of another host (whose pids
    cannot be checked from here) is waited for: delete it by hand if that host is gone."""
    me = f"{os.getpid()} {socket.gethostname()}"
    said = False
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            holder = path.read_text(errors="replace").strip() if path.exists() else ""
            pid, _, host = holder.partition(" ")
            if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
                _say(f"{path}: stale lock of dead process {pid} on {host}; taken over")
                path.unlink(missing_ok=True)
                continue
            if not said:
                _say(f"{path.parent} is being trained by another process ({holder or '?'}); waiting for it to end")
                said = True
            time.sleep(poll)
    try:
        os.write(fd, f"{me}\n".encode())
        os.fsync(fd)
        os.close(fd)
        yield
    finally:
        if path.exists() and path.read_text(errors="replace").strip() == me:
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
