"""Checkpoints of a run: atomic, self-verifying files in ``<outdir>/checkpoints/``.

File name ``ckpt-e{EPOCH:04d}-b{BATCH:06d}.pt``: the position training resumes from (the epoch
to run and the batch index within it), so the names sort chronologically. Layout::

    b"DMLCKPT1" | sha256(payload) (32 bytes) | len(payload) (8 bytes, little endian) | payload

where the payload is ``torch.save`` of a dict of tensors and plain Python values (loaded with
``weights_only=True``; NumPy RNG state is stored as a tensor). A file is written to a temporary
name in the same folder, fsync'ed and renamed, so a crash leaves either the old set of
checkpoints or the new one, never a half-written ``ckpt-*.pt``. ``load_latest`` still verifies
length and digest of every candidate, newest first; a file that fails is renamed to
``*.corrupt`` (with a message) and the previous one is tried; with none left the run restarts.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import signal
import struct
from pathlib import Path
from typing import Any

import torch

from dmlrepro.atomic import atomic_open

log = logging.getLogger(__name__)

MAGIC = b"DMLCKPT1"
_HEADER = len(MAGIC) + 32 + 8
_NAME = re.compile(r"^ckpt-e(\d{4,})-b(\d{6,})\.pt$")

#: Test-only hook: SIGKILL this process in the middle of its N-th checkpoint write (after
#: part of the temporary file is written, before the rename).
ENV_KILL_IN_CHECKPOINT = "DMLREPRO_TEST_KILL_IN_CHECKPOINT"
_writes = 0


class CheckpointError(RuntimeError):
    """A checkpoint file that is truncated, corrupt or not a checkpoint."""


def checkpoint_name(epoch: int, batch: int) -> str:
    return f"ckpt-e{int(epoch):04d}-b{int(batch):06d}.pt"


def list_checkpoints(folder: str | os.PathLike) -> list[Path]:
    """Checkpoint files in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_file():
            found.append(((int(m.group(1)), int(m.group(2))), p))
    return [p for _, p in sorted(found)]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_verified(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """``torch.save(state)`` into ``path`` in the verified layout, atomically."""
    global _writes
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = MAGIC + hashlib.sha256(payload).digest() + struct.pack("<Q", len(payload))
    _writes += 1
    kill_at = os.environ.get(ENV_KILL_IN_CHECKPOINT)
    with atomic_open(path, "wb") as f:
        f.write(header)
        if kill_at and int(kill_at) == _writes:  # test hook: die half-way through the write
            f.write(payload[: len(payload) // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        f.write(payload)
    _fsync_dir(folder)
    return path


def save_checkpoint(folder: str | os.PathLike, state: dict[str, Any], epoch: int, batch: int, keep: int = 2) -> Path:
    """Write ``state`` atomically as the checkpoint for position (epoch, batch); keep the newest ``keep``."""
    folder = Path(folder)
    path = write_verified(folder / checkpoint_name(epoch, batch), state)
    for old in list_checkpoints(folder)[:-keep]:
        if old != path:
            old.unlink(missing_ok=True)
    for stale in folder.glob(".ckpt-*.tmp"):  # temporaries of a process that was killed mid-write
        stale.unlink(missing_ok=True)
    return path


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load and verify one checkpoint file; raises :class:`CheckpointError` if it is damaged."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < _HEADER or not data.startswith(MAGIC):
        raise CheckpointError(f"{path}: not a dmlrepro checkpoint (bad header)")
    digest = data[len(MAGIC) : len(MAGIC) + 32]
    (length,) = struct.unpack("<Q", data[len(MAGIC) + 32 : _HEADER])
    payload = data[_HEADER:]
    if len(payload) != length:
        raise CheckpointError(f"{path}: truncated ({len(payload)} of {length} payload bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"{path}: sha256 mismatch (corrupt file)")
    try:
        return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except Exception as e:  # pragma: no cover - a verified payload that torch cannot read
        raise CheckpointError(f"{path}: cannot be read by torch.load ({e})") from e


def load_latest(folder: str | os.PathLike, map_location: Any = "cpu") -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that verifies, or None. Damaged files are renamed ``*.corrupt``."""
    for path in reversed(list_checkpoints(folder)):
        try:
            return read_checkpoint(path, map_location), path
        except (CheckpointError, OSError) as e:
            msg = f"checkpoint {path} cannot be used ({e}); renamed to {path.name}.corrupt, trying an older one"
            log.warning(msg)
            print(f"dmlrepro train: {msg}", flush=True)
            try:
                path.rename(path.with_name(path.name + ".corrupt"))
            except OSError:
                pass
    return None
