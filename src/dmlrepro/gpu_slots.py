"""GPU slots for local jobs: one workstation, several GPUs, every job on a GPU of its own
(docs/workflow.md#one-node-several-gpus).

Snakemake's ``gpu`` resource only counts GPUs; it never says which. So with local execution the
workflow's ``onstart`` (``offer``) lists the node's GPUs (config ``gpus``, else every visible one),
names them to the jobs in ``SLOTS_ENV`` and caps the jobs that ask for a GPU at the slot count
(``--resources gpu=N`` unless given). A job that asks for ``gpu: n`` (``lease``, in
``dmlrepro.jobserver.run_job``) takes ``n`` free slots on distinct devices and sees only those devices
(``CUDA_VISIBLE_DEVICES``; ``SLOT_ENV`` names them as the node numbers them).

A slot is an exclusive ``flock`` on a file in the node's lock folder (``LOCKS_ENV``), one per device
and slot: the kernel frees it when the last process holding it ends, however it ends (SIGKILL
included), and two workflows on the node that share the folder (the default) never hold one slot at
once; a job that finds every slot held waits for one. SLURM assigns GPUs itself: ``offer`` runs only
with local execution.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Lease", "lease", "offer", "visible_devices", "workflow_devices"]

SLOTS_ENV = "DMLREPRO_GPU_SLOTS"  # the workflow's devices, comma-separated (set by `offer`)
JOBS_PER_GPU_ENV = "DMLREPRO_JOBS_PER_GPU"  # slots per device (config jobs_per_gpu)
LOCKS_ENV = "DMLREPRO_GPU_LOCKS"  # the node's lock folder; every workflow on the node must share it
SLOT_ENV = "DMLREPRO_GPU_SLOT"  # a job's device(s), as the node numbers them (= its CUDA_VISIBLE_DEVICES)
DEFAULT_LOCKS = "/tmp/dmlrepro-gpu-locks"
POLL_S = 0.5  # how often a job that finds every slot held tries again
HELP = "docs/workflow.md#one-node-several-gpus"


# -- the workflow's side (onstart) ---------------------------------------------------------------
def visible_devices(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPUs this process may use, as CUDA numbers them: ``CUDA_VISIBLE_DEVICES``'s entries when it
    is set, else ``0 .. torch.cuda.device_count() - 1`` (none, without importing torch, on a node
    without an NVIDIA driver)."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [entry.strip() for entry in environ["CUDA_VISIBLE_DEVICES"].split(",") if entry.strip()]
    if not Path("/dev/nvidiactl").exists():
        return []
    import torch  # deferred: only a node with a driver pays for the import

    return [str(index) for index in range(torch.cuda.device_count())]


def workflow_devices(gpus: Sequence[int | str] | None, visible: Sequence[str]) -> list[str]:
    """The devices the workflow's jobs share: config ``gpus`` (each one visible; ValueError of one
    line otherwise), or every visible one when it is null."""
    if gpus is None:
        return list(visible)
    missing = [str(gpu) for gpu in gpus if str(gpu) not in visible]
    if missing:
        raise ValueError(
            f"config gpus: {', '.join(missing)} not visible on this node (visible: {', '.join(visible) or 'none'}, "
            f"CUDA_VISIBLE_DEVICES or else torch.cuda.device_count(); {HELP})"
        )
    return [str(gpu) for gpu in gpus]


def offer(workflow: Any, config: Mapping[str, Any], environ: MutableMapping[str, str] = os.environ) -> int:
    """onstart, local execution: name the workflow's devices to its jobs (``SLOTS_ENV``,
    ``JOBS_PER_GPU_ENV``) and, unless ``--resources gpu=N`` was given, cap the GPU jobs at the slot
    count. Returns that count (0: no GPU, the jobs run as they are)."""
    devices = workflow_devices(config.get("gpus"), visible_devices(environ))
    if not devices:
        environ.pop(SLOTS_ENV, None)
        return 0
    per_gpu = config.get("jobs_per_gpu", 1)
    environ.update({SLOTS_ENV: ",".join(devices), JOBS_PER_GPU_ENV: str(per_gpu)})
    slots = len(devices) * per_gpu
    if "gpu" not in workflow.global_resources:
        _limit_resource(workflow, "gpu", slots)
    limit = workflow.global_resources["gpu"].value
    print(
        f"dmlrepro: GPU slots: devices {', '.join(devices)}, {per_gpu} job(s) each; at most {limit} GPU jobs "
        f"at once; locks in {environ.get(LOCKS_ENV, DEFAULT_LOCKS)} ({HELP})",
        file=sys.stderr,
    )
    return slots


def _limit_resource(workflow: Any, name: str, value: int) -> None:
    """What ``--resources name=value`` sets, once the scheduler exists (Snakemake 9: its own
    ``register_resource`` updates the free amount but not the total it subtracts from)."""
    workflow.global_resources[name] = value
    workflow.scheduler.global_resources[name] = value
    workflow.scheduler.resources[name] = value


# -- the job's side ------------------------------------------------------------------------------
@dataclass
class Lease:
    """A job's slots: the open lock files (``fds``, held while any copy of them is open) and their
    devices."""

    fds: list[int]
    devices: list[str]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


@contextlib.contextmanager
def lease(count: int, environ: MutableMapping[str, str] = os.environ) -> Iterator[Lease | None]:
    """``count`` slots on distinct devices while the block runs, waiting while all are held, with
    ``CUDA_VISIBLE_DEVICES`` and ``SLOT_ENV`` set to their devices in ``environ``. None (nothing
    set) for a job that asks for no GPU or a workflow without slots (no GPU, SLURM)."""
    if not count or not environ.get(SLOTS_ENV):
        yield None
        return
    held = _acquire(count, environ)
    environ.update({"CUDA_VISIBLE_DEVICES": ",".join(held.devices), SLOT_ENV: ",".join(held.devices)})
    try:
        yield held
    finally:
        held.close()


def _acquire(count: int, environ: Mapping[str, str]) -> Lease:
    devices = environ[SLOTS_ENV].split(",")
    per_gpu = int(environ.get(JOBS_PER_GPU_ENV, "1"))
    if count > len(devices):
        raise ValueError(f"a job asks for {count} GPUs; the workflow has {len(devices)} ({', '.join(devices)}; {HELP})")
    folder = _lock_folder(Path(environ.get(LOCKS_ENV, DEFAULT_LOCKS)))
    waiting = False
    while (held := _try_slots(folder, devices, per_gpu, count)) is None:
        if not waiting:
            print(
                f"dmlrepro: waiting for a free GPU slot: devices {', '.join(devices)} x {per_gpu} are all held "
                f"(another workflow on this node? locks in {folder}; {HELP})",
                file=sys.stderr,
                flush=True,
            )
            waiting = True
        time.sleep(POLL_S)
    return held


def _try_slots(folder: Path, devices: Sequence[str], per_gpu: int, count: int) -> Lease | None:
    """``count`` slots on distinct devices, every device's first slot before any second one; None
    (holding nothing) when there are not that many free."""
    held = Lease([], [])
    for slot in range(per_gpu):
        for device in devices:
            if device in held.devices:
                continue
            fd = _open_lock(folder / f"gpu-{_file_name(device)}-{slot}.lock")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.fds.append(fd)
            held.devices.append(device)
            if len(held.devices) == count:
                return held
    held.close()
    return None


def _lock_folder(folder: Path) -> Path:
    """The lock folder, made writable for every user of the node (sticky, as /tmp) when this one
    makes it: two users' workflows must see each other's locks."""
    if not folder.is_dir():
        with contextlib.suppress(FileExistsError):
            folder.mkdir(parents=True)
            folder.chmod(0o1777)
    return folder


def _open_lock(path: Path) -> int:
    """The lock file, opened read-only (another user's file, 0644, still locks) and made if missing;
    no O_CREAT on an existing file: Linux's protected_regular refuses it in a sticky folder."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        pass
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CREAT, 0o644)
    except PermissionError:
        raise PermissionError(
            f"GPU slots: cannot make {path}: the lock folder must be writable by every user of the node "
            f"(or {LOCKS_ENV} names another, the same for every workflow; {HELP})"
        ) from None


def _file_name(device: str) -> str:
    """A device id (an index, a UUID, a MIG id) as part of a file name."""
    return re.sub(r"[^\w.-]", "_", device)


@contextlib.contextmanager
def announced(environ: Mapping[str, str] = os.environ) -> Iterator[None]:
    """In a job's log: its GPU(s) and when it started and stopped using them (wall-clock seconds)."""
    if SLOT_ENV not in environ:
        yield
        return
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    print(f"dmlrepro: on GPU {environ[SLOT_ENV]} (CUDA_VISIBLE_DEVICES={visible}) from {time.time():.3f}")
    try:
        yield
    finally:
        print(f"dmlrepro: done with GPU {environ[SLOT_ENV]} at {time.time():.3f}")
