"""Atomic file writes (docs/architecture.md: write a temp file in the same folder, then rename).

Every output the pipeline trusts (manifests, embeddings, metrics, checkpoints) is written through
here, so a crash leaves either the old file or the new one, never a half-written one. The file gets
the mode a plain ``open`` would give it (0666 less the umask: on a shared cluster, group members read a
colleague's results when the umask lets them), and the rename itself is made durable by an fsync of
the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator:
    """Open a temporary file next to ``path``; on a clean exit fsync it and rename it onto ``path``.

    On an exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as fh:
            os.fchmod(fh.fileno(), 0o666 & ~current_umask())  # mkstemp makes it 0600
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_folder(path.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def current_umask() -> int:
    """The process's umask, read without changing it (/proc/self/status, Linux >= 4.7); elsewhere
    set and restored at once."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_folder(folder: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename into it) to disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (NaN/Inf rejected) atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return Path(path)


def remove_path(path: str | os.PathLike) -> None:
    """Remove a file or a folder tree if it exists (used to clean up partial work)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
