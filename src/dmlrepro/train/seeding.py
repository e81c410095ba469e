"""Deterministic seeding, and capture/restore of every random number generator of the process."""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def loss_seed(seed: int) -> int:
    """Seed of the loss's parameter initialisation (proxies), derived from the run's seed."""
    return int(np.random.SeedSequence([int(seed), 0x1055]).generate_state(1, np.uint64)[0] >> 2)


def set_deterministic_algorithms(mode: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` without its import of the compiler stack (torch._inductor, a costly
    import: docs/benchmarks.md#measurements-behind-code-choices-cpu): inductor's flag is set only where
    inductor is loaded, the only place it is read (no run compiles its model)."""
    torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)
    if "torch._inductor.config" in sys.modules:
        sys.modules["torch._inductor.config"].deterministic = mode


class DeterminismGuard:
    """Context manager: ``torch.use_deterministic_algorithms`` (+ cuDNN flags, cuBLAS workspace)
    and the thread count for the duration of a run; the previous settings come back afterwards."""

    def __init__(self, deterministic: bool, threads: int | None):
        self.deterministic, self.threads = deterministic, threads

    def __enter__(self):
        self._prev = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            torch.get_num_threads(),
        )
        if self.deterministic:
            # cuBLAS needs this before its first use to be deterministic (read once per process).
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            set_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        if self.threads:
            torch.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc):
        det, warn, cd, cb, threads = self._prev
        set_deterministic_algorithms(det, warn_only=warn)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cd, cb
        torch.set_num_threads(threads)
        return False


def rng_state() -> dict[str, Any]:
    """All generator states as tensors / plain values (loadable with ``weights_only=True``)."""
    kind, keys, key_position, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(key_position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    restore_cuda_rng(state.get("cuda"))


def restore_cuda_rng(saved: list[torch.Tensor] | None) -> None:
    """The saved CUDA generator states of the devices visible now: a checkpoint of a process that
    saw more GPUs restores the first ones (this engine trains on one), one that saw fewer or none
    (a CPU run) leaves the others as seeded by :func:`seed_everything`."""
    if not saved or not torch.cuda.is_available():
        return
    n = min(len(saved), torch.cuda.device_count())
    if n < len(saved):
        print(
            f"dmlrepro train: checkpoint has CUDA RNG states of {len(saved)} GPUs, {n} visible: "
            f"restoring the first {n}",
            flush=True,
        )
    for i in range(n):
        torch.cuda.set_rng_state(saved[i], i)
