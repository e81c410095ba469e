"""One run shape on this node: the training engine's own trainer (model, loss, optimizer, AMP and
GradScaler, datasets, sampler, validation and ASAP state, built by ``dmlrepro.train.engine``)
for the shape's representative run, its data pipeline, N optimizer steps of the engine's step,
its evaluation's embedding loop and metrics, and the peak memory.

Measured (:class:`Measurement`):

* ``images_per_second``: the engine's training DataLoader (the configured transforms, sampler and
  workers, at most the CPUs this process may use), from its creation to the last of at least
  ``steps + 1`` and ``2 × workers`` batches (worker start-up included);
* ``step_seconds``: one optimizer step of the engine (``Trainer.step``) on batches already in
  memory, the device synchronised around it; the median of the steps after the first (the only
  one with ``--steps 1``); ``synthetic_images_per_second`` = batch / step_seconds;
* ``eval_images_per_second``: the engine's embedding loop (``embed_batches``: float32, inference
  mode) over one in-memory evaluation batch of the run's ``dataset.eval_batch_size`` (the test
  split's first images read through the engine's evaluation loader, repeated where the split is
  smaller), the device synchronised around it, after one untimed pass of the same batch (the
  float32 kernels' first-call costs, which a run pays once); the loader's time is not counted;
* ``eval_metric_seconds``: the engine's ``embedding_metrics`` on the embeddings of the test split's
  first evaluation batch (with a gallery: against gallery images of their classes), timed apart;
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
from dmlrepro.train.embedder import embed_batches
from dmlrepro.train.engine import Trainer
from dmlrepro.train.run_evaluation import compute_embeddings, embedding_metrics
from dmlrepro.train.runtime import apply_speed, available_cpus, resolve_device, resolve_runtime, restore_speed
from dmlrepro.train.seeding import DeterminismGuard

from .sources import DataSource


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
    eval_metric_seconds: float | None = None
    peak_memory_mb: float | None = None
    amp: str = "off"
    workers: int | None = None  # the DataLoader's workers
    notes: list[str] = field(default_factory=list)


def preflight_config(
    cfg: dict[str, Any], *, device: str, source: DataSource, batch_size: int | None = None, random_init: bool = False
) -> dict[str, Any]:
    """The run config the preflight builds: the run's own, on ``device``, with the data from
    ``source``, at most the CPUs this process may use for workers, and optionally a smaller batch
    (a multiple of ``dataset.m`` for the m-per-class sampler) and random initialisation."""
    d = cfg["dataset"]
    workers = cfg["num_workers"]
    if workers != "auto":
        workers = min(int(workers), max(0, available_cpus() - 1))
    override: dict[str, Any] = {
        "device": device,
        "num_workers": workers,
        "dataset": {"root": source.root, "prepare": source.prepare},
    }
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
        with contextlib.closing(trainer.parts):  # the loaders' workers
            _measure_trainer(trainer, lrs, run_cfg, steps, result)


def _measure_trainer(trainer, lrs: dict[str, float], run_cfg: dict[str, Any], steps: int, result: Measurement) -> None:
    amp = trainer.parts.amp_dtype
    result.amp = str(amp).removeprefix("torch.") if amp is not None else "off"
    result.batch_size, result.workers = run_cfg["dataset"]["batch_size"], run_cfg["num_workers"]
    batches, result.images_per_second = load_batches(trainer, steps)
    result.step_seconds = time_steps(trainer, lrs, batches, steps)
    result.synthetic_images_per_second = result.batch_size / result.step_seconds
    result.eval_images_per_second, result.eval_metric_seconds = measure_evaluation(trainer)


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
    """(the engine's trainer, its optimizer groups' lrs): the trainer at its first trained epoch's settings (lrs,
    followup attributes, trainability after a warm-up: a frozen trunk would not measure training), ASAP's first
    selection where the step needs it (sample-based proxies)."""
    trainer = Trainer.for_measurement(cfg, outdir)
    lrs = trainer.start_epoch(cfg["warmup_epochs"] + 1)
    projections = trainer.parts.projections
    if projections is not None and projections.samples:
        projections.initialize()  # eq. 4.10: the selected samples are part of every step
    return trainer, lrs


def load_batches(trainer, steps: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], float]:
    """(the first ``steps`` batches, images per second of the loader over at least ``steps + 1``
    and ``2 × workers`` batches, start-up included)."""
    parts = trainer.parts
    wanted = min(max(steps + 1, 2 * parts.cfg["num_workers"]), parts.sampler.num_batches())
    kept, images = [], 0
    start = time.perf_counter()
    for i, (x, y, _) in enumerate(parts.epoch_loader(trainer.state.epoch)):
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
    times, device = [], trainer.parts.device
    for x, y in batches[:steps]:
        _sync_device(device)
        start = time.perf_counter()
        trainer.step(x, y)
        _sync_device(device)
        times.append(time.perf_counter() - start)
        trainer.state.batch += 1
    bad = trainer.sync(trainer.state.epoch, lrs)
    if bad:
        raise FloatingPointError(f"non-finite {bad['what']} at step {bad['step']} of the preflight")
    return statistics.median(times[1:] if len(times) > 1 else times)


def measure_evaluation(trainer) -> tuple[float, float]:
    """(images per second of the engine's embedding loop, seconds of the engine's metrics): module
    docstring. Raises when the embeddings are not finite."""
    x, y, distinct = eval_batch(trainer)
    parts = trainer.parts
    model, device = parts.model, parts.device
    emb, labels = embed_batches(model, [(x, y)], device)  # untimed: first-call costs
    _sync_device(device)
    start = time.perf_counter()
    embed_batches(model, [(x, y)], device)
    _sync_device(device)
    images_per_second = len(x) / (time.perf_counter() - start)
    emb, labels = emb[:distinct], labels[:distinct].numpy()
    gallery = None
    if parts.gallery_ds is not None:
        wanted = set(labels.tolist())
        rows = [i for i, label in enumerate(parts.gallery_ds.labels) if int(label) in wanted][: len(x)]
        g_emb, g_labels, _ = compute_embeddings(
            model, _subset(parts.gallery_ds, rows), batch_size=len(x), device=device, on_device=True
        )
        gallery = (g_emb, g_labels)
    start = time.perf_counter()
    metrics = embedding_metrics(emb, labels, parts.cfg, gallery)
    metric_seconds = time.perf_counter() - start
    if metrics is None:
        raise FloatingPointError("the evaluation's embeddings are not finite")
    return images_per_second, metric_seconds


def eval_batch(trainer) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(images, labels, distinct): one evaluation batch of ``dataset.eval_batch_size`` images in
    memory (pinned on CUDA, as the run's loader gives them), the test split's first ``distinct``
    items read through the engine's evaluation loader (its workers, one share each), repeated
    where the split is smaller (a stand-in's 64 images)."""
    parts = trainer.parts
    n, ds = parts.settings.eval_batch_size, parts.test_ds
    items = list(range(min(n, len(ds))))
    share = -(-len(items) // max(1, parts.embedder.num_workers))
    shares = [[(i, None) for i in items[s : s + share]] for s in range(0, len(items), share)]
    xs, ys = zip(*((x, y) for x, y, _ in parts.embedder.batches(ds, shares, "preflight evaluation batch")))
    order = torch.arange(n) % len(items)
    x, y = torch.cat(xs)[order], torch.cat(ys)[order]
    return (x.pin_memory() if parts.device.type == "cuda" else x), y, len(items)


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
