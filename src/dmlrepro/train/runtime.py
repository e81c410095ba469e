"""How a run uses the machine it is on: CPUs for the data loader and torch, determinism and the
CUDA speed options. Every value here is a runtime key (``config.RUNTIME_KEYS``): it can change
speed and float rounding, never the experiment, and it is not part of a run id.

``num_workers: auto`` gives the DataLoader every CPU this process may use
(``os.sched_getaffinity``, capped by ``SLURM_CPUS_PER_TASK`` for clusters that do not bind CPUs
and by ``threads`` when set) less :data:`MAIN_PROCESS_CPUS` for the training process, whose torch
then runs that many threads. ``deterministic: auto`` is on for the CPU and off on CUDA, where
deterministic kernels are slower and a run is still not bit-exact (docs/training.md#bit-exactness).

A run that asked for a GPU (``device: cuda``, ``DMLREPRO_GPUS`` > 0 or a GPU slot: :func:`gpus_requested`) and
cannot use one stops in :func:`resolve_device`, before any data or model is built, with one line
saying why (:func:`gpu_unusable_reason`); ``device: auto`` falls back to the CPU only where no GPU was
requested (docs/environment.md#gpu-driver).
"""

from __future__ import annotations

import copy
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import torch

from .config import ConfigError

#: CPUs the training process itself needs beside its DataLoader workers (it only feeds the device).
MAIN_PROCESS_CPUS = 1


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by the SLURM allocation's CPUs."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        n = min(n, int(slurm))
    return max(1, n)


def resolve_runtime(cfg: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A copy of the resolved run config with ``device``, ``num_workers``, ``threads`` and
    ``deterministic`` made concrete for this process and ``device`` (written to the run's
    config.yaml: what it used). The one place a run's ``device: auto`` is decided: everything
    after it reads :func:`run_device`."""
    out = copy.deepcopy(cfg)
    out["device"] = str(device)
    if out["num_workers"] == "auto":
        budget = min(available_cpus(), out["threads"] or available_cpus())
        out["num_workers"] = max(0, budget - MAIN_PROCESS_CPUS)
        out["threads"] = max(1, budget - out["num_workers"])
    if out["deterministic"] == "auto":
        out["deterministic"] = device.type == "cpu"
    return out


def apply_speed(speed: dict[str, Any], deterministic: bool) -> tuple:
    """cuDNN autotuning (not with ``deterministic``: it picks kernels by timing) and TF32 in CUDA
    matmuls and cuDNN convolutions, both exactly as ``speed.tf32`` says (torch's own default has cuDNN
    TF32 on); returns the previous values. Every k-NN search turns TF32 off for itself
    (:func:`dmlrepro.evaluation.knn.exact_float32`)."""
    prev = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cudnn.benchmark = bool(speed["cudnn_benchmark"]) and not deterministic
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(speed["tf32"])
    return prev


def restore_speed(prev: tuple) -> None:
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


#: the oldest NVIDIA Linux driver (major version) each CUDA major version runs on (NVIDIA's CUDA
#: Toolkit release notes, "CUDA minor version compatibility"): torch 2.14.1+cu130 needs >= 580
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
#: what CUDA_VISIBLE_DEVICES holds when a scheduler or a user hides every GPU
HIDDEN = ("", "-1", "NoDevFiles")


def driver_version(proc: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    """The loaded NVIDIA driver's version (the kernel module's `proc` file, else nvidia-smi), or None."""
    try:
        text = proc.read_text()
    except OSError:
        text = ""
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    if found:
        return found.group(1)
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()[:1] if out.returncode == 0 else []
    return first[0].strip() if first else None


def required_driver(cuda: str | None) -> int | None:
    """The oldest driver (major version) a torch built for CUDA `cuda` ("13.0") runs on; None: unknown."""
    return MIN_DRIVER.get(int(cuda.split(".")[0])) if cuda else None


def gpu_unusable_reason() -> str | None:
    """Why torch cannot use a GPU on this node, in one line (None: it can)."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in HIDDEN:
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    driver, need = driver_version(), required_driver(torch.version.cuda)
    if driver is None:
        return "no NVIDIA driver is loaded on this node (no /proc/driver/nvidia/version, no nvidia-smi)"
    if need is not None and int(driver.split(".")[0]) < need:
        cuda = torch.version.cuda
        return f"NVIDIA driver {driver} is too old for torch {torch.__version__} (CUDA {cuda} needs >= {need})"
    return f"NVIDIA driver {driver} is loaded but torch sees no CUDA device (CUDA_VISIBLE_DEVICES={visible!r})"


def gpus_requested() -> int:
    """The GPUs this process's job asked for: ``DMLREPRO_GPUS`` (the job's request), else the GPU slots
    the workflow gave it (``DMLREPRO_GPU_SLOT``: dmlrepro.gpu_slots); 0 when neither is set."""
    value = os.environ.get("DMLREPRO_GPUS", "").strip()
    if value.isdigit():
        return int(value)
    return len([s for s in os.environ.get("DMLREPRO_GPU_SLOT", "").split(",") if s.strip()])


def resolve_device(name: str) -> torch.device:
    """The run's torch device: ``auto`` is CUDA where a GPU is usable, else the CPU unless the job asked
    for a GPU (:func:`gpus_requested`); ``cuda`` / ``cuda:i`` must be usable. Otherwise a one-line
    :class:`ConfigError` saying why, before anything is built."""
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        dev = torch.device("cuda" if name == "auto" else name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"run config: device = {name!r}: only {torch.cuda.device_count()} CUDA device(s) are visible here"
            )
        return dev
    if name == "auto" and gpus_requested() == 0:
        return torch.device("cpu")
    why = "" if name.startswith("cuda") else f" and its job asked for {gpus_requested()} GPU(s)"
    raise ConfigError(
        f"run config: device = {name!r}{why}, but no GPU is usable: {gpu_unusable_reason()} (`dmlrepro doctor`)"
    )


def device_identity(device: torch.device) -> dict[str, Any]:
    """Which hardware ran: the device's name and, for a GPU, the physical one (CUDA_VISIBLE_DEVICES,
    the job server's DMLREPRO_GPU_SLOT, the device's uuid)."""
    cuda = device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    return {
        "device_name": torch.cuda.get_device_name(index) if cuda else cpu_model(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_slot": os.environ.get("DMLREPRO_GPU_SLOT"),
        "gpu_uuid": str(torch.cuda.get_device_properties(index).uuid) if cuda else None,
    }


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_device(cfg: dict[str, Any]) -> torch.device:
    """The device :func:`resolve_runtime` chose for this run config."""
    if cfg["device"] == "auto":
        raise ValueError(
            "run config: device = 'auto' is not resolved yet; resolve_runtime(cfg, resolve_device(...)) "
            "decides it once per run"
        )
    return torch.device(cfg["device"])


def evaluation_device(requested: str | None, recorded: str) -> torch.device:
    """Where ``dmlrepro evaluate`` embeds and searches: the `requested` device, else the one the run
    recorded in its config.yaml where this machine has it, else ``auto`` here."""
    if requested:
        return resolve_device(requested)
    if recorded != "auto" and (not recorded.startswith("cuda") or torch.cuda.is_available()):
        return torch.device(recorded)
    return resolve_device("auto")
