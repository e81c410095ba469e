"""How a run uses the machine it is on: CPUs for the data loader and torch, determinism and the
CUDA speed options. Every value here is a runtime key (``config.RUNTIME_KEYS``): it can change
speed and float rounding, never the experiment, and it is not part of a run id.

``num_workers: auto`` gives the DataLoader every CPU this process may use
(``os.sched_getaffinity``, capped by ``SLURM_CPUS_PER_TASK`` for clusters that do not bind CPUs
and by ``threads`` when set) less :data:`MAIN_PROCESS_CPUS` for the training process, whose torch
then runs that many threads. ``deterministic: auto`` is on for the CPU and off on CUDA, where
deterministic kernels are slower and a run is still not bit-exact (docs/training.md#bit-exactness).
"""

from __future__ import annotations

import copy
import os
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
    """cuDNN autotuning (not with ``deterministic``: it picks kernels by timing) and TF32 in matmuls
    and convolutions (``tf32: false`` leaves torch's defaults); returns the previous values."""
    prev = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cudnn.benchmark = bool(speed["cudnn_benchmark"]) and not deterministic
    if speed["tf32"]:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return prev


def restore_speed(prev: tuple) -> None:
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def resolve_device(name: str) -> torch.device:
    """The run's torch device: ``auto`` is CUDA where a GPU is visible, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"run config: device = {name!r}: expected a device that exists (no CUDA GPU is visible); "
            f"use 'auto' or 'cpu'"
        )
    return dev


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
