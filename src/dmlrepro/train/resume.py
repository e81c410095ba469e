"""What a run's checkpoint holds, writing it, and resuming from it (docs/training.md, the resume
protocol); the file format is :mod:`.checkpoint`'s.

A record holds the run config's identity, the position (:class:`~dmlrepro.train.state.TrainState`),
the model, the loss (its proxies and buffers), the optimizer, the GradScaler, every RNG state, the
autocast dtype trained with, and the validation and ASAP projection state. Restoring refuses a
record of another config and keeps the autocast dtype the record trained with.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .checkpoint import save_checkpoint
from .config import ConfigError, config_identity
from .hooks import CheckpointPolicy
from .outputs import say as _say
from .seeding import rng_state, set_rng_state
from .state import TrainState

CHECKPOINT_FORMAT = 1


def first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    """The first key (dotted) where two configs differ, with both values; None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            d = first_difference(a.get(k), b.get(k), f"{prefix}{k}.")
            if d:
                return d
        return None
    return None if a == b else f"{prefix.rstrip('.')}: {a!r} (run directory) vs {b!r} (now)"


def checkpoint_record(
    stored_cfg: dict, state: TrainState, *, model, loss, optimizer, stepper, validation, projections
) -> dict[str, Any]:
    """The checkpoint record: a copy of everything the after-epoch hooks may change in place
    (the position, loss, validation and projections state), references to the rest."""
    amp_dtype = stepper.amp_dtype
    record = {
        "format": CHECKPOINT_FORMAT,
        "config": config_identity(stored_cfg),
        "position": state.to_dict(),
        "model": model.state_dict(),
        "loss": copy.deepcopy(loss.state_dict()),
        "optimizer": optimizer.state_dict(),
        "scaler": stepper.scaler.state_dict(),
        "rng": rng_state(),
        "amp_dtype": str(amp_dtype).removeprefix("torch.") if amp_dtype else None,
    }
    if validation is not None:
        record["validation"] = validation.state_dict()
    if projections is not None:
        record["projections"] = projections.state_dict()
    return record


def write_checkpoint(
    ckdir: Path, make_record: Callable[[], dict[str, Any]], keep: int, policy: CheckpointPolicy
) -> Path:
    """Write the record at its position (the newest ``keep`` checkpoints stay); the policy learns
    what it cost."""
    t0 = time.perf_counter()
    record = make_record()
    position = record["position"]
    path = save_checkpoint(ckdir, record, position["epoch"], position["batch"], keep)
    policy.record(time.perf_counter() - t0, path.stat().st_size)
    return path


def restore_checkpoint(
    record: dict[str, Any],
    path: Path,
    stored_cfg: dict,
    ckdir: Path,
    amp_enabled: bool | str,
    *,
    model,
    loss,
    optimizer,
    stepper,
    validation,
    projections,
) -> TrainState:
    """Load `record` (read from `path`) into the run's parts and every RNG; the position to go on from.
    A record of another config (or format) is refused."""
    # config_identity of the stored identity too: keys that became runtime keys later drop out of both
    diff = first_difference(config_identity(record.get("config") or {}), config_identity(stored_cfg))
    if record.get("format") != CHECKPOINT_FORMAT or diff:
        raise ConfigError(
            f"checkpoint {path} belongs to another config ({diff or 'format'}); "
            f"use another output directory or delete {ckdir}"
        )
    restore_amp(record, path, stepper, amp_enabled, ckdir)
    model.load_state_dict(record["model"])
    loss.load_state_dict(record["loss"])
    optimizer.load_state_dict(record["optimizer"])
    scaler = stepper.scaler
    if record["scaler"] or not scaler.is_enabled():  # an enabled scaler refuses an empty state
        scaler.load_state_dict(record["scaler"])
    set_rng_state(record["rng"])
    state = TrainState.from_dict(record["position"])
    if validation is not None:
        validation.load_state_dict(record["validation"])
    if projections is not None:
        projections.load_state_dict(record["projections"])
    _say(f"resuming from {path.name} (epoch {state.epoch}, batch {state.batch})")
    return state


def restore_amp(record: dict[str, Any], path: Path, stepper, amp_enabled: bool | str, ckdir: Path) -> None:
    """Resume in the autocast dtype the checkpoint trained with: ``amp.enabled: auto`` resolves
    by device, so a run moved between CPU and CUDA keeps the checkpoint's dtype (with a message)."""
    if "amp_dtype" not in record:  # written before the dtype was recorded
        return
    saved = getattr(torch, record["amp_dtype"]) if record["amp_dtype"] else None
    if saved == stepper.amp_dtype:
        return
    if amp_enabled != "auto":  # pragma: no cover - amp.* is part of the identity
        raise ConfigError(
            f"checkpoint {path}: amp.enabled = {amp_enabled!r} trained with "
            f"autocast {record['amp_dtype']}, now {stepper.amp_dtype}; delete {ckdir} to restart"
        )
    _say(
        f"amp.enabled = auto: keeping the checkpoint's autocast dtype {record['amp_dtype'] or 'off (float32)'} "
        f"on {stepper.device} (it trained with it)"
    )
    stepper.set_amp(saved)
