"""What a run writes about itself: ``train_log.csv`` rows, the fields every ``metrics.json``
record shares and, for the report, the loss's final proxies (docs/training.md#run-directory).
Functions of the config, the state and the loss."""

from __future__ import annotations

import csv
import io
import logging
from typing import Any

import numpy as np

from dmlrepro.atomic import atomic_write_bytes, atomic_write_text
from dmlrepro.losses import has_proxies, trained_proxies

from .optim import in_followup
from .state import RunDir, TrainState

log = logging.getLogger("dmlrepro.train.engine")


def say(msg: str) -> None:
    """A run's message: logged and printed (``dmlrepro train: ...``)."""
    log.info(msg)
    print(f"dmlrepro train: {msg}", flush=True)


def history_row(
    cfg: dict,
    state: TrainState,
    epoch: int,
    steps: int,
    loss,
    lrs,
    seconds: float,
    metrics,
    proxy_metrics=None,
    val_metrics=None,
) -> dict[str, Any]:
    """One train_log.csv row (a history entry of the checkpointed state)."""
    row = {
        "epoch": epoch,
        "steps": steps,
        "loss": loss,
        "lrs": lrs,
        "seconds": seconds,
        "phase": 2 if epoch and in_followup(cfg, epoch, state.followup_start) else 1,
        "test_metrics": metrics,
    }
    if proxy_metrics is not None:  # only with eval.proxy_metrics_per_epoch (older histories lack the key)
        row["proxy_metrics"] = proxy_metrics
    if val_metrics is not None:  # only with a validation split
        row["val_metrics"] = val_metrics
    return row


def write_train_log(rundir: RunDir, cfg: dict, state: TrainState, group_names: list[str], validated: bool) -> None:
    """train_log.csv from the history: one row per epoch (row 0 = the untrained network)."""
    # per-epoch proxy metrics (RSW Fig. 9's AvgDTP): one column each, only when asked for
    per_epoch = list(cfg["eval"]["proxy_metrics"]) if cfg["eval"]["proxy_metrics_per_epoch"] else []
    val = [cfg["validation"]["metric"]] if validated else []  # val_map@r
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "epoch",
            "phase",
            "steps",
            "loss",
            *[f"lr_{n}" for n in group_names],
            "seconds",
            "test_recall@1",
            *per_epoch,
            *[f"val_{n}" for n in val],
        ]
    )
    for r in state.history:
        lrs = r["lrs"] or {}
        m = r["test_metrics"]
        pm = r.get("proxy_metrics") or {}
        w.writerow(
            [
                r["epoch"],
                r["phase"],
                r["steps"],
                "" if r["loss"] is None else repr(float(r["loss"])),
                *[repr(lrs[n]) if n in lrs else "" for n in group_names],
                f"{r['seconds']:.3f}",
                "" if not m else repr(m["recall@1"]),
                *[repr(pm[n]) if n in pm else "" for n in per_epoch],
                *[repr(r["val_metrics"][n]) if r.get("val_metrics") else "" for n in val],
            ]
        )
    atomic_write_text(rundir.train_log, buf.getvalue())


def last_finite(state: TrainState) -> tuple[int | None, dict[str, float], dict[str, float] | None]:
    """Epoch, test metrics and (when logged per epoch) proxy metrics of the last finite evaluation."""
    for r in reversed(state.history):
        if r["test_metrics"]:
            return r["epoch"], r["test_metrics"], r.get("proxy_metrics")
    return None, {}, None


def common_fields(cfg: dict, state: TrainState) -> dict[str, Any]:
    """The fields of metrics.json that completed and diverged records share."""
    hist = state.history
    untrained = hist[0]["test_metrics"] if hist and hist[0]["epoch"] == 0 else None
    common = {
        "select": cfg["eval"]["select"],
        "epochs": cfg["epochs"],
        "global_steps": state.global_step,
        "untrained_metrics": untrained,
        "best_epoch": (state.best or {}).get("epoch"),
        "stopped_epoch": state.stopped,
    }
    if cfg["followup"]["trigger"] == "plateau":  # the first phase-2 epoch (null: never switched)
        common["followup_start_epoch"] = state.followup_start
    return common


def diverged_record(cfg: dict, state: TrainState, info: dict[str, Any]) -> dict[str, Any]:
    """metrics.json of a diverged run: where it diverged and the last finite evaluation."""
    epoch, metrics, proxy = last_finite(state)
    record = {
        "status": "diverged",
        "epoch": epoch,
        "metrics": metrics,
        "diverged_at": {k: info[k] for k in ("epoch", "step", "global_step", "what")},
        "distance": cfg["eval"]["distance"],
        "ks": cfg["eval"]["ks"],
        "split": cfg["dataset"]["test_split"],
        **common_fields(cfg, state),
    }
    if proxy is not None:  # the proxy metrics of that same last finite evaluation (RSW Table III)
        record["proxy_metrics"] = proxy
    return record


def write_final_proxies(rundir: RunDir, loss, classes: np.ndarray) -> None:
    """``final_proxies.npz``: the loss's proxies after training, as trained (the final checkpoint holds
    them) and the training class of each (row c·P + k belongs to class c, P proxies per class;
    `classes` sorted, as the engine maps labels), so the report draws them without a checkpoint.
    Nothing for a loss declared without proxies (dmlrepro.losses.registry)."""
    if not has_proxies(loss):
        return
    proxies, per_class = trained_proxies(loss)
    proxies = proxies.cpu().numpy()
    buf = io.BytesIO()
    np.savez(buf, proxies=proxies, labels=np.repeat(np.asarray(classes), max(per_class, 1))[: len(proxies)])
    atomic_write_bytes(rundir.final_proxies, buf.getvalue())
