"""One run shape on this node: the training engine's own trainer (model, loss, optimizer, AMP and
GradScaler, datasets, sampler, validation and ASAP state, built by ``dmlrepro.train.engine``)
for the shape's representative run, its data pipeline, N optimizer steps of the engine's step,
one evaluation over a small embedding set, and the peak memory.

Measured (:class:`Measurement`):

* ``images_per_second``: the engine's training DataLoader (the configured transforms, sampler and
  workers, at most the CPUs this process may use), from its creation to the last of at least
  ``steps + 1`` and ``2 × workers`` batches (worker start-up included);
* ``step_seconds``: one optimizer step of the engine (``Trainer.step``) on batches already in
  memory, the device synchronised around it; the median of the steps after the first (the only
  one with ``--steps 1``); ``synthetic_images_per_second`` = batch / step_seconds;
* ``eval_images_per_second``: the engine's ``compute_embeddings`` over one evaluation batch of
  the test split, whose embeddings then go through the engine's ``embedding_metrics``;
* ``peak_memory_mb``: ``torch.cuda.max_memory_allocated`` on CUDA (reset before the shape); on
  the CPU the process's resident-set high-water mark (``resource.getrusage``), reset before the
  shape through ``/proc/self/clear_refs`` where Linux allows it.
"""

from __future__ import annotations

import contextlib
import copy
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmlrepro.nested import deep_merge
from dmlrepro.train.config import resolve_run_config
from dmlrepro.train.engine import Trainer
from dmlrepro.train.run_evaluation import compute_embeddings, embedding_metrics
from dmlrepro.train.runtime import apply_speed, available_cpus, resolve_device, resolve_runtime, restore_speed
from dmlrepro.train.seeding import DeterminismGuard

from .standin import DataSource


@dataclass
class Measurement:
    """What one shape measured (None where it failed before that point)."""

    status: str = "ok"  # ok | failed
    error: str | None = None
    batch_size: int | None = None  # the batch the steps used
    step_seconds: float | None = None
    images_per_second: float | None = None
    synthetic_images_per_second: float | None = None
    eval_images_per_second: float | None = None
    peak_memory_mb: float | None = None
    amp: str = "off"
    workers: int | None = None  # the DataLoader's workers
    notes: list[str] = field(default_factory=list)


def preflight_config(cfg: dict[str, Any], *, device: str, source: DataSource, batch_size: int | None = None,
                     random_init: bool = False) -> dict[str, Any]:
    """The run config the preflight builds: the run's own, on ``device``, with the data from
    ``source``, at most the CPUs this process may use for workers, and optionally a smaller batch
    (a multiple of ``dataset.m`` for the m-per-class sampler) and random initialisation."""
    d = cfg["dataset"]
    workers = cfg["num_workers"]
    if workers != "auto":
        workers = min(int(workers), max(0, available_cpus() - 1))
    override: dict[str, Any] = {"device": device, "num_workers": workers,
                                "dataset": {"root": source.root, "prepare": source.prepare}}
    if batch_size is not None:
        b = int(batch_size)
        if d["sampler"] == "m_per_class":
            b = max(d["m"], b - b % d["m"])
        override["dataset"].update(batch_size=b, eval_batch_size=min(d["eval_batch_size"], b))
    if random_init:
        override["model"] = {"pretrained": False}
    return resolve_run_config(deep_merge(cfg, override))


def measure_shape(cfg: dict[str, Any], steps: int) -> Measurement:
    """Build the engine's trainer for the resolved preflight config ``cfg`` and measure it
    (module docstring). Any exception is the shape's failure, recorded with its type and message."""
    result = Measurement()
    device = resolve_device(cfg["device"])  # decided once: the engine reads the concrete name
    cfg = {**cfg, "device": str(device)}
    reset_peak_memory(device)
    try:
        with tempfile.TemporaryDirectory(prefix="dmlrepro-preflight-run-") as outdir:
            _measure(cfg, steps, Path(outdir), result)
    except Exception as error:  # noqa: BLE001 - every failure of a shape is reported, not raised
        result.status, result.error = "failed", f"{type(error).__name__}: {error}"
    finally:
        result.peak_memory_mb = peak_memory_mb(device)
    return result


def _measure(cfg: dict[str, Any], steps: int, outdir: Path, result: Measurement) -> None:
    with engine_process(cfg) as run_cfg:
        trainer, lrs = build_trainer(run_cfg, outdir)
        with contextlib.closing(trainer):
            _measure_trainer(trainer, lrs, run_cfg, steps, result)


def _measure_trainer(trainer, lrs: dict[str, float], run_cfg: dict[str, Any], steps: int, result: Measurement) -> None:
    result.amp = str(trainer.amp_dtype).removeprefix("torch.") if trainer.amp_dtype is not None else "off"
    result.batch_size, result.workers = run_cfg["dataset"]["batch_size"], run_cfg["num_workers"]
    batches, result.images_per_second = load_batches(trainer, steps)
    result.step_seconds = time_steps(trainer, lrs, batches, steps)
    result.synthetic_images_per_second = result.batch_size / result.step_seconds
    result.eval_images_per_second = evaluate_small(trainer)


@contextlib.contextmanager
def engine_process(cfg: dict[str, Any]):
    """The process settings a training job runs under (``dmlrepro.train.engine._train_locked``):
    the runtime keys made concrete for this device, the speed options, deterministic algorithms and
    the thread count; restored afterwards. Yields the concrete config."""
    run_cfg = resolve_runtime(cfg, resolve_device(cfg["device"]))
    prev = apply_speed(run_cfg["speed"], run_cfg["deterministic"])
    try:
        with DeterminismGuard(run_cfg["deterministic"], run_cfg["threads"]):
            yield run_cfg
    finally:
        restore_speed(prev)


def build_trainer(cfg: dict[str, Any], outdir: Path):
    """(the engine's trainer, its optimizer groups' lrs): the trainer at its first trained epoch's settings (lrs, followup attributes,
    trainability after a warm-up: a frozen trunk would not measure training), ASAP's first
    selection where the step needs it (sample-based proxies)."""
    trainer = Trainer.for_measurement(cfg, outdir)
    lrs = trainer.start_epoch(cfg["warmup_epochs"] + 1)
    if trainer.projections is not None and trainer.projections.samples:
        trainer.projections.initialize()  # eq. 4.10: the selected samples are part of every step
    return trainer, lrs


def load_batches(trainer, steps: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], float]:
    """(the first ``steps`` batches, images per second of the loader over at least ``steps + 1``
    and ``2 × workers`` batches, start-up included)."""
    wanted = min(max(steps + 1, 2 * trainer.cfg["num_workers"]), trainer.sampler.num_batches())
    kept, images = [], 0
    start = time.perf_counter()
    for i, (x, y, _) in enumerate(trainer.epoch_loader(trainer.state.epoch)):
        images += len(x)
        if i < steps:
            kept.append((x, y))
        if i + 1 >= wanted:
            break
    seconds = time.perf_counter() - start
    while len(kept) < steps:  # an epoch shorter than the steps asked for: steps repeat its batches
        kept.append(kept[len(kept) % max(len(kept), 1)])
    return kept, images / seconds


def time_steps(trainer, lrs: dict[str, float], batches: list[tuple[torch.Tensor, torch.Tensor]], steps: int) -> float:
    """Seconds per optimizer step of the engine on in-memory batches; raises when the loss or the
    gradients are not finite (the engine's divergence check)."""
    trainer.open_window()
    times = []
    for x, y in batches[:steps]:
        _sync_device(trainer.device)
        start = time.perf_counter()
        trainer.step(x, y)
        _sync_device(trainer.device)
        times.append(time.perf_counter() - start)
        trainer.state.batch += 1
    bad = trainer.sync(trainer.state.epoch, lrs)
    if bad:
        raise FloatingPointError(f"non-finite {bad['what']} at step {bad['step']} of the preflight")
    return statistics.median(times[1:] if len(times) > 1 else times)


def evaluate_small(trainer) -> float:
    """Images per second of the engine's test embedding over one evaluation batch of the test split
    (with a gallery: of the queries, and gallery images of their classes), then the engine's
    metrics on those embeddings; raises when they are not finite."""
    cfg = trainer.cfg
    n = cfg["dataset"]["eval_batch_size"]
    queries = _subset(trainer.test_ds, range(min(n, len(trainer.test_ds))))
    start = time.perf_counter()
    emb, labels, _ = compute_embeddings(trainer.model, queries, batch_size=n, device=trainer.device)
    seconds = time.perf_counter() - start
    gallery = None
    if trainer.gallery_ds is not None:
        wanted = set(labels.tolist())
        rows = [i for i, label in enumerate(trainer.gallery_ds.labels) if int(label) in wanted][:n]
        g_emb, g_labels, _ = compute_embeddings(trainer.model, _subset(trainer.gallery_ds, rows), batch_size=n,
                                                device=trainer.device)
        gallery = (g_emb, g_labels)
    if embedding_metrics(emb, labels, cfg, gallery) is None:
        raise FloatingPointError("the evaluation's embeddings are not finite")
    return len(emb) / seconds


def _subset(ds, positions):
    """The items ``positions`` of a ManifestDataset, as a ManifestDataset (it keeps ``rows``)."""
    positions = np.asarray(list(positions), dtype=np.int64)
    sub = copy.copy(ds)
    sub.rows = np.asarray(ds.rows)[positions]
    sub.paths = [ds.paths[i] for i in positions]
    sub.labels = np.asarray(ds.labels)[positions]
    sub.true_labels = np.asarray(ds.true_labels)[positions]
    if getattr(ds, "_cache", None) is not None:
        sub._cache = {}
    return sub


def _sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- peak memory ----------------------------------------------------------------------------------
def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError):  # Linux >= 4.0: "5" resets the resident-set high-water mark
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kib / (2**20 if sys.platform == "darwin" else 2**10)
