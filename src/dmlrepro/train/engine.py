"""The training engine: one resolved run config -> a trained model, its test embeddings and
metrics, in a run directory that can be interrupted and resumed at any point.

Run directory (docs/training.md, :class:`~dmlrepro.train.state.RunDir`): ``config.yaml``
(resolved), ``train_log.csv`` (one row per epoch, row 0 = the untrained network),
``embeddings_test.npz`` (the selected model's test embeddings, saved once), ``metrics.json`` and
``checkpoints/`` (resume only).

Shape: :class:`Trainer` holds the run's parts and its :class:`~dmlrepro.train.state.TrainState`;
``_train_epoch`` (train_one_epoch) runs the steps (:class:`~dmlrepro.train.stepper.Stepper`:
autocast, GradScaler, clipping, divergence flags), then the after-epoch hooks (validation with
ASAP's projections, test evaluation, proxy metrics; all embedding through the run's
:class:`~dmlrepro.train.embedder.Embedder`), then the end of the epoch (logs, a checkpoint when
the :class:`~dmlrepro.train.hooks.CheckpointPolicy` says so). At the finish, a loss with proxies
exports them (``final_proxies.npz``) for the report.

Resume protocol: a checkpoint is written at the end of an epoch (by the policy; always after the
last) and, on SIGTERM/SIGUSR1/SIGUSR2, after the current optimizer step or, during the hooks, of
the state the epoch's training ended with (then :class:`RunInterrupted`; the CLI exits 75). A
restarted ``train_run`` on the same directory loads the newest valid checkpoint -- model, loss
parameters, optimizer, GradScaler, every RNG state, epoch, batch index within the epoch, the
epoch's running loss and the history -- and continues; on CPU with ``deterministic: true`` the
final weights and metrics equal those of an uninterrupted run bit for bit (tests/train/test_resume.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import time
import zipfile
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm import tqdm

from dmlrepro.atomic import atomic_write_text, write_json_atomic
from dmlrepro.evaluation.embeddings_io import load_embeddings
from dmlrepro.losses import proxy_points, use_sample_proxies
from dmlrepro.preflight.projection import warn_time_budget

from .checkpoint import load_latest, read_checkpoint, save_checkpoint
from .config import ConfigError, config_identity, dump_yaml, resolve_run_config
from .embedder import Embedder, EmbeddingInterrupted
from .hooks import CheckpointPolicy, TestEvaluation, proxy_metrics
from .imagecache import attach as attach_image_cache, share_image_cache
from .model_and_loss import build_run_loss, build_run_model
from .optim import apply_trainability, build_optimizer, group_lrs, in_followup, linked_groups, named_groups, set_lrs
from .outputs import common_fields, diverged_record, history_row, say as _say, write_final_proxies, write_train_log
from .precision import EVAL_PRECISION, precision_name, training_amp_dtype
from .preemption import RunInterrupted, StopFlag
from .projections import Projections
from .run_data import (
    SeededBatchSampler,
    SeededDataset,
    build_batch_sampler,
    build_datasets,
    build_gallery,
    build_train_eval,
    build_validation,
    loader_generator,
    open_manifest,
    worker_init,
)
from .run_evaluation import corruption_metrics, final_metrics
from .runlock import _LOCK_FILE, _lock_file, _run_lock  # noqa: F401 (tests and tools use them here)
from .runtime import apply_speed, available_cpus, resolve_device, resolve_runtime, restore_speed, run_device
from .seeding import DeterminismGuard, loss_seed, rng_state, seed_everything, set_rng_state
from .state import RunDir, TrainState
from .stepper import Stepper
from .validation import Validation

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1

__all__ = ["Trainer", "TrainState", "RunDir", "resolve_device", "train_run"]


def _stored_yaml(cfg: dict) -> Any:
    """The config as config.yaml stores it (its YAML round trip): what a run's identity is read from."""
    return yaml.safe_load(dump_yaml(cfg))


def _first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            d = _first_difference(a.get(k), b.get(k), f"{prefix}{k}.")
            if d:
                return d
        return None
    return None if a == b else f"{prefix.rstrip('.')}: {a!r} (run directory) vs {b!r} (now)"


def train_run(config: dict, outdir: str | os.PathLike, *, progress: bool | None = None) -> dict[str, Any]:
    """Train one run described by ``config`` (partial; resolved here) into ``outdir``.

    Returns the content of ``metrics.json``: ``status`` ``"completed"`` (metrics of the selected
    epoch) or ``"diverged"`` (``diverged_at`` and the last finite evaluation). A run directory
    whose metrics.json already records a finished run is returned as is. Raises
    :class:`RunInterrupted` after a preemption signal (checkpoint written) and
    :class:`ConfigError` for a bad config or a directory holding a run with another config.
    """
    cfg = resolve_run_config(config)
    outdir = Path(outdir)
    fresh = not outdir.exists()  # a start that fails before a checkpoint removes the folder it made
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        blocker = next((p for p in outdir.parents if p.exists()), outdir)
        kind = "is a file" if blocker.is_file() else "is not writable"
        raise ConfigError(
            f"OUTDIR {outdir}: cannot create the run folder ({error.strerror}; {blocker} {kind}); "
            f"expected a writable folder path"
        ) from error
    try:
        with _run_lock(outdir):
            return _train_locked(cfg, outdir, progress)
    except BaseException:
        if fresh and not any(RunDir(outdir).checkpoints.glob("*")):
            from dmlrepro.atomic import remove_path  # noqa: PLC0415 (only a failed start needs it)

            remove_path(outdir)
        raise


def _train_locked(cfg: dict, outdir: Path, progress: bool | None) -> dict[str, Any]:
    # temporaries of atomic writes (.NAME.RANDOM.tmp) left by a process killed mid-write; with
    # the run lock held no other process is writing here
    rundir = RunDir(outdir)
    for stale in rundir.temporaries():
        stale.unlink(missing_ok=True)
    stored_cfg = _stored_yaml(cfg)
    cfg_path = rundir.config
    if cfg_path.is_file():
        try:
            old = yaml.safe_load(cfg_path.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            # damaged (we write it atomically): rewritten; a checkpoint's own config record still
            # guards against resuming another run's checkpoints (Trainer._restore)
            _say(f"{cfg_path} is damaged ({type(e).__name__}); rewritten from the run config")
            old = stored_cfg
        if not isinstance(old, dict):
            raise ConfigError(
                f"{cfg_path}: expected a YAML mapping (the resolved run config), got "
                f"{type(old).__name__}; delete the file to resume"
            )
        diff = _first_difference(config_identity(old), config_identity(stored_cfg))
        if diff:
            raise ConfigError(
                f"{outdir} holds a run with a different config ({diff}); "
                f"use another output directory or delete this one"
            )
    # num_workers / threads / deterministic as this process uses them (runtime keys: config.yaml records them)
    asked = cfg["threads"]  # the workflow's job CPUs
    cfg = resolve_runtime(cfg, resolve_device(cfg["device"]))
    atomic_write_text(cfg_path, dump_yaml(cfg))
    mpath = rundir.metrics
    record = _finished_record(mpath)
    if record is not None:
        _say(f"{outdir}: already finished ({record['status']}); nothing to do")
        return record
    if progress is None:
        progress = os.isatty(2)
    _say(
        f"{available_cpus()} CPUs available (threads asked: {asked}): num_workers {cfg['num_workers']}, "
        f"torch threads {cfg['threads'] or torch.get_num_threads()}, deterministic {cfg['deterministic']}"
    )
    prev = apply_speed(cfg["speed"], cfg["deterministic"])
    try:
        with DeterminismGuard(cfg["deterministic"], cfg["threads"]), StopFlag() as stop:
            trainer = Trainer(cfg, stored_cfg, outdir, bool(progress), stop)
            try:
                return trainer.run()
            finally:
                trainer.close()
    finally:
        restore_speed(prev)


def _finished_record(mpath: Path) -> dict[str, Any] | None:
    """The record of a finished run, or None. A metrics.json that does not parse or lacks the
    fields every finished record has (half-written by a foreign, non-atomic writer, or damaged)
    is not trusted: it is removed, with a message, and the run is finished again from its
    checkpoints, rather than stopping the run with a JSON error."""
    if not mpath.is_file():
        return None
    try:
        record = json.loads(mpath.read_text())
        problem = None
        if not isinstance(record, dict):
            problem = "not a JSON object"
        elif record.get("status") not in ("completed", "diverged"):
            problem = f"status {record.get('status')!r}"
        elif not isinstance(record.get("metrics"), dict) or (
            record["status"] == "completed" and "recall@1" not in record["metrics"]
        ):
            problem = "no metrics"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        problem = f"unreadable: {e}"
    if problem is None:
        return record
    _say(f"{mpath} is incomplete or damaged ({problem}); removed, finishing the run from its checkpoints")
    mpath.unlink(missing_ok=True)
    return None


class Trainer:
    """One run: its parts (model, loss, optimizer, data, :class:`Embedder`, hooks, :class:`Stepper`),
    its :class:`TrainState`, checkpoints of both, and the epoch loop (:meth:`run`).

    The loop's pieces are public for the preflight and benchmarks/bench_training.py, which time
    them without a run: :meth:`for_measurement`, :meth:`start_epoch`, :meth:`epoch_loader`,
    :meth:`open_window`, :meth:`step`, :meth:`sync`."""

    def __init__(self, cfg: dict, stored_cfg: dict, outdir: Path, progress: bool, stop: StopFlag | None):
        self.cfg, self.stored_cfg, self.progress, self.stop = cfg, stored_cfg, progress, stop
        self.rundir = RunDir(outdir)
        self.outdir, self.ckdir = self.rundir.root, self.rundir.checkpoints
        self.device = run_device(cfg)  # resolved once, by resolve_runtime
        self.amp_dtype = training_amp_dtype(cfg, self.device)  # training only: evaluation is float32
        seed_everything(cfg["seed"])  # model init from the run's seed (a bad model config fails before the data)
        self.model = build_run_model(cfg)
        self._build_data()
        # the loss's init (proxies) from its own stream: independent of whatever preparing the data did
        torch.manual_seed(loss_seed(cfg["seed"]))
        self.loss = build_run_loss(cfg, len(self.labelmap), self.model.embedding_size)
        if cfg["asap"]["enabled"] and cfg["asap"]["proxies"] == "samples":
            use_sample_proxies(self.loss)  # eq. 4.10: proxies = embedded samples, no trainable proxy parameter
        self._check_proxy_metrics()
        self._to_device()
        self.phase1_attrs = {k: getattr(self.loss, k) for k in cfg["followup"]["loss"]}
        self.groups = named_groups(self.model, self.loss)
        self.optimizer = build_optimizer(cfg, self.groups, linked_groups(self.loss))
        self._build_hooks()
        self.stepper = Stepper(
            cfg,
            model=self.model,
            loss=self.loss,
            optimizer=self.optimizer,
            groups=self.groups,
            labelmap=self.labelmap,
            projections=self.projections,
            device=self.device,
            amp_dtype=self.amp_dtype,
        )
        # cache_images: one decoded copy of each image for every loader worker of the run
        self.image_cache = share_image_cache(
            [self.train_ds, self.test_ds, getattr(self.validation, "ds", None)],
            cfg["speed"]["image_cache_mb"],
            _say if stop is not None else (lambda _msg: None),
        )
        self.state = TrainState()
        self.policy = CheckpointPolicy(cfg["speed"]["checkpoint_overhead"], cfg["speed"]["checkpoint_floor_mb"])
        self.open_window()  # reopened at every epoch's start (from the restored position)

    @classmethod
    def for_measurement(cls, cfg: dict, outdir: Path) -> Trainer:
        """A trainer outside a run (no stop flag, no progress bars): preflight and benchmarks."""
        return cls(cfg, _stored_yaml(cfg), outdir, False, None)

    def _build_data(self) -> None:
        cfg = self.cfg
        self.manifest = manifest = open_manifest(cfg["dataset"])  # refuses a truncated manifest (data layer)
        self.train_ds, self.test_ds, self.labelmap = build_datasets(
            cfg["dataset"], manifest, self.model, cfg["validation"]
        )
        self._train_eval_ds = None
        self.gallery_ds = build_gallery(cfg["dataset"], manifest, self.model)
        self.sampler = SeededBatchSampler(
            build_batch_sampler(cfg["dataset"], self.train_ds, cfg["seed"]), cfg["seed"], cfg["steps_per_epoch"]
        )
        if self.sampler.num_batches() == 0:
            raise ConfigError(
                f"run config: dataset.batch_size = {cfg['dataset']['batch_size']}: an epoch has no "
                f"full batch of the {len(self.train_ds)} training images"
            )
        self._loader: torch.utils.data.DataLoader | None = None

    def _to_device(self) -> None:
        self.model.to(self.device)
        if self.cfg["speed"]["channels_last"]:  # NHWC activations (tensor cores); the batches follow in _step
            self.model.to(memory_format=torch.channels_last)
        self.loss.to(self.device)
        self.labelmap.table = self.labelmap.table.to(self.device)

    def _build_hooks(self) -> None:
        """The Embedder and the after-epoch hooks: validation (with ASAP's projections), test evaluation."""
        cfg = self.cfg
        self.embedder = Embedder(
            self.model,
            self.device,
            batch_size=cfg["dataset"]["eval_batch_size"],
            num_workers=cfg["num_workers"],
            progress=self.progress,
            stop=self.stop,
        )
        self.projections = (
            Projections(
                cfg,
                model=self.model,
                loss=self.loss,
                optimizer=self.optimizer,
                embedder=self.embedder,
                train_ds=self.train_ds,
                train_eval_ds=self.train_eval_ds,
                labelmap=self.labelmap,
            )
            if cfg["asap"]["enabled"]
            else None
        )
        self.validation = None
        if cfg["validation"]["split"]:
            val_ds = build_validation(cfg["dataset"], cfg["validation"], self.manifest, self.model)
            self.validation = Validation(
                cfg,
                val_ds,
                model=self.model,
                embedder=self.embedder,
                rundir=self.rundir,
                steps_per_epoch=self.sampler.num_batches(),
                projections=self.projections,
            )
        self.test_eval = TestEvaluation(
            cfg,
            test_ds=self.test_ds,
            gallery_ds=self.gallery_ds,
            model=self.model,
            embedder=self.embedder,
            rundir=self.rundir,
        )

    def train_eval_ds(self):
        """The run's training images with the eval transform (built once)."""
        if self._train_eval_ds is None:
            rows = self.train_ds.rows if self.validation is not None else None
            self._train_eval_ds = build_train_eval(self.cfg["dataset"], self.manifest, self.model, rows)
            attach_image_cache(self.image_cache, self._train_eval_ds)
        return self._train_eval_ds

    def close(self) -> None:
        """Stop the worker processes of the run's loaders."""
        self.embedder.close()
        it = getattr(self._loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._loader = None

    # -- checkpoints ---------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        """The checkpoint record: a copy of everything the after-epoch hooks may change in place
        (the position, loss, validation and projections state), references to the rest."""
        state = {
            "format": CHECKPOINT_FORMAT,
            "config": config_identity(self.stored_cfg),
            "position": self.state.to_dict(),
            "model": self.model.state_dict(),
            "loss": copy.deepcopy(self.loss.state_dict()),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.stepper.scaler.state_dict(),
            "rng": rng_state(),
            "amp_dtype": str(self.amp_dtype).removeprefix("torch.") if self.amp_dtype else None,
        }
        if self.validation is not None:
            state["validation"] = self.validation.state_dict()
        if self.projections is not None:
            state["projections"] = self.projections.state_dict()
        return state

    def _save(self, state: dict[str, Any] | None = None) -> Path:
        t0 = time.perf_counter()
        state = self._state() if state is None else state
        position = state["position"]
        path = save_checkpoint(self.ckdir, state, position["epoch"], position["batch"], self.cfg["checkpoint"]["keep"])
        self.policy.record(time.perf_counter() - t0, path.stat().st_size)
        return path

    def _restore(self, state: dict[str, Any], path: Path) -> None:
        # config_identity of the stored identity too: keys that became runtime keys later drop out of both
        diff = _first_difference(config_identity(state.get("config") or {}), config_identity(self.stored_cfg))
        if state.get("format") != CHECKPOINT_FORMAT or diff:
            raise ConfigError(
                f"checkpoint {path} belongs to another config ({diff or 'format'}); "
                f"use another output directory or delete {self.ckdir}"
            )
        self._restore_amp(state, path)
        self.model.load_state_dict(state["model"])
        self.loss.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        scaler = self.stepper.scaler
        if state["scaler"] or not scaler.is_enabled():  # an enabled scaler refuses an empty state
            scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.state = TrainState.from_dict(state["position"])
        if self.validation is not None:
            self.validation.load_state_dict(state["validation"])
        if self.projections is not None:
            self.projections.load_state_dict(state["projections"])
        _say(f"resuming from {path.name} (epoch {self.state.epoch}, batch {self.state.batch})")

    def _restore_amp(self, state: dict[str, Any], path: Path) -> None:
        """Resume in the autocast dtype the checkpoint trained with: ``amp.enabled: auto`` resolves
        by device, so a run moved between CPU and CUDA keeps the checkpoint's dtype (with a message)."""
        if "amp_dtype" not in state:  # written before the dtype was recorded
            return
        saved = getattr(torch, state["amp_dtype"]) if state["amp_dtype"] else None
        if saved == self.amp_dtype:
            return
        if self.cfg["amp"]["enabled"] != "auto":  # pragma: no cover - amp.* is part of the identity
            raise ConfigError(
                f"checkpoint {path}: amp.enabled = {self.cfg['amp']['enabled']!r} trained with "
                f"autocast {state['amp_dtype']}, now {self.amp_dtype}; delete {self.ckdir} to restart"
            )
        _say(
            f"amp.enabled = auto: keeping the checkpoint's autocast dtype {state['amp_dtype'] or 'off (float32)'} "
            f"on {self.device} (it trained with it)"
        )
        self.amp_dtype = saved
        self.stepper.set_amp(saved)

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        had_files = any(self.ckdir.glob("ckpt-*.pt")) if self.ckdir.is_dir() else False
        found = load_latest(self.ckdir, map_location="cpu")
        if found is not None:
            self._restore(*found)
            # the log is rebuilt from the checkpointed history: a rerun whose train_log.csv was
            # removed (Snakemake deletes a job's declared outputs before rerunning it) or damaged
            # gets it back even when the checkpoint is the final one and no epoch runs
            # (else `snakemake --rerun-incomplete` after a killed controller ends in MissingOutput)
            if self.state.history:
                self._write_log()
        else:
            if had_files:
                _say("no usable checkpoint left; restarting the run from scratch")
            self._interruptible(self._start)
        for epoch in range(self.state.epoch, self.cfg["epochs"] + 1):
            if self.state.stopped:  # validation early stopping
                break
            diverged = self._train_epoch(epoch)
            if diverged:
                return self._finish_diverged(diverged)
        return self._interruptible(self._finish_completed)

    def _start(self) -> None:
        """Before the first epoch: ASAP's first proxies (Alg. 1, k-Center from random samples) and
        the untrained network's evaluation (row 0 of the log)."""
        if self.projections is not None:
            self.validation.record_selection(self.projections.initialize())
        if self.cfg["eval"]["before_training"]:
            t0 = time.perf_counter()
            metrics = self._evaluate(0)
            self.state.history.append(
                self._row(0, 0, None, None, time.perf_counter() - t0, metrics, self._epoch_proxy_metrics(metrics))
            )

    def _interruptible(self, fn, snapshot: dict[str, Any] | None = None):
        """``fn()``; a preemption signal while it embeds ends the run with exit 75 after
        checkpointing `snapshot` (the state before `fn` began; None: the last checkpoint stands,
        `fn` runs again on resume)."""
        try:
            return fn()
        except EmbeddingInterrupted:
            path = self._save(snapshot) if snapshot is not None else self.ckdir
            raise RunInterrupted(self.stop.signum, path) from None

    def _row(self, epoch, steps, loss, lrs, seconds, metrics, proxy_metrics=None, val_metrics=None) -> dict[str, Any]:
        return history_row(self.cfg, self.state, epoch, steps, loss, lrs, seconds, metrics, proxy_metrics, val_metrics)

    def _epoch_proxy_metrics(self, metrics: dict[str, float] | None) -> dict[str, float] | None:
        """eval.proxy_metrics of the current proxies and model, at an evaluated epoch whose test
        embeddings were finite, when eval.proxy_metrics_per_epoch asks for them (RSW Fig. 9)."""
        if metrics is None or not self.cfg["eval"]["proxy_metrics_per_epoch"]:
            return None
        return self._proxy_metrics()

    def _apply_epoch_settings(self, epoch: int) -> dict[str, float]:
        cfg = self.cfg
        start = self.state.followup_start  # followup.trigger plateau: the epoch phase 2 began (None: not yet)
        lrs = group_lrs(cfg, epoch, start)
        set_lrs(self.optimizer, lrs)
        attrs = cfg["followup"]["loss"] if in_followup(cfg, epoch, start) else self.phase1_attrs
        for k, v in attrs.items():
            setattr(self.loss, k, v)
        apply_trainability(cfg, self.model, self.loss, epoch)
        return {g["name"]: g["lr"] for g in self.optimizer.param_groups}

    def start_epoch(self, epoch: int) -> dict[str, float]:
        """Position at `epoch`'s start, its settings (lrs, followup loss attributes, trainability)
        applied, model and loss in train mode; the groups' lrs."""
        self.state.epoch, self.state.batch = epoch, 0
        lrs = self._apply_epoch_settings(epoch)
        self.model.train()
        self.loss.train()
        return lrs

    def epoch_loader(self, epoch: int, start_batch: int = 0) -> torch.utils.data.DataLoader:
        """The run's training DataLoader, positioned at ``epoch`` from batch ``start_batch``. Built
        once per run (persistent workers); the batches and each image's augmentation seed come
        from the sampler, a function of (seed, epoch, batch) only, so which process decodes an
        image changes nothing (resumes stay bit-identical)."""
        self.sampler.set_epoch(epoch, start_batch)
        if self._loader is None:
            nw = self.cfg["num_workers"]
            self._loader = torch.utils.data.DataLoader(
                SeededDataset(self.train_ds),
                batch_sampler=self.sampler,
                num_workers=nw,
                persistent_workers=nw > 0,
                worker_init_fn=worker_init if nw else None,
                generator=loader_generator(self.cfg["seed"], epoch, 1),
                pin_memory=self.device.type == "cuda",
            )
        return self._loader

    def _train_epoch(self, epoch: int) -> dict[str, Any] | None:
        """train_one_epoch: the steps from the position on, then the after-epoch hooks; None, or
        the divergence record."""
        st = self.state
        lrs = self._apply_epoch_settings(epoch)
        self.model.train()
        self.loss.train()
        t0 = time.perf_counter()
        bad = self._train_steps(epoch, lrs, t0)
        st.epoch_seconds += time.perf_counter() - t0
        if bad:
            return bad
        snapshot = self._state()  # what a signal during the hooks checkpoints: they run again on resume
        outcome = self._interruptible(lambda: self._after_epoch(epoch, lrs), snapshot)
        if outcome is not None:
            return outcome
        self._end_epoch(epoch, t0)
        return None

    def _train_steps(self, epoch: int, lrs: dict[str, float], t0: float) -> dict[str, Any] | None:
        """The epoch's optimizer steps from the position on; the host reads the device's loss and
        flags every ``speed.sync_every`` steps. A signal: checkpoint after the step, RunInterrupted."""
        st, every = self.state, self.cfg["speed"]["sync_every"]
        bar = tqdm(
            self.epoch_loader(epoch, st.batch),
            total=self.sampler.num_batches(),
            initial=st.batch,
            disable=not self.progress,
            desc=f"epoch {epoch}/{self.cfg['epochs']}",
            leave=False,
            dynamic_ncols=True,
        )
        self.open_window()
        with contextlib.closing(bar):
            for x, y, _ in bar:
                self._step(x, y)
                st.batch += 1
                st.global_step += 1
                st.epoch_steps += 1
                self.stop.step_done()
                if st.batch % every == 0 or self.stop:
                    bad = self._sync(epoch, lrs)
                    if bad:
                        return bad
                    if self.progress and st.batch % 10 == 0:
                        bar.set_postfix(loss=f"{st.epoch_loss_sum / st.epoch_steps:.4g}")
                if self.stop:
                    st.epoch_seconds += time.perf_counter() - t0
                    raise RunInterrupted(self.stop.signum, self._save())
        return self._sync(epoch, lrs)

    def _after_epoch(self, epoch: int, lrs: dict[str, float]) -> dict[str, Any] | None:
        """The hooks: validation (early stopping, followup, ASAP), test evaluation, proxy metrics;
        then the epoch's history row. None, or the divergence record of non-finite embeddings."""
        st = self.state
        val_metrics = None
        if self.validation is not None:
            val_metrics = self.validation.evaluate(epoch, st.global_step)
            if val_metrics is None:
                return {
                    "epoch": epoch,
                    "step": st.batch,
                    "global_step": st.global_step,
                    "what": "validation embeddings",
                    "lrs": lrs,
                }
            self._plateau_control(epoch)
        final = epoch == self.cfg["epochs"] or bool(st.stopped)
        metrics = None
        if self.test_eval.due(epoch, final):
            metrics = self._evaluate(epoch, final)
            if metrics is None:
                return {
                    "epoch": epoch,
                    "step": st.batch,
                    "global_step": st.global_step,
                    "what": "embeddings",
                    "lrs": lrs,
                }
        loss_mean = st.epoch_loss_sum / max(st.epoch_steps, 1)
        st.history.append(
            self._row(
                epoch,
                st.epoch_steps,
                loss_mean,
                lrs,
                st.epoch_seconds,
                metrics,
                self._epoch_proxy_metrics(metrics),
                val_metrics,
            )
        )
        return None

    def _end_epoch(self, epoch: int, t0: float) -> None:
        """The position moves on; logs; a checkpoint when the policy (or the last epoch, or a
        signal) asks for one; a signal ends the run (exit 75)."""
        st = self.state
        final = epoch == self.cfg["epochs"] or bool(st.stopped)
        st.next_epoch()
        self._write_log()
        if self.validation is not None:
            self.validation.write_log()
        if final or self.stop or self.policy.due():
            self._save()
        warn_time_budget(self.cfg, epoch, time.perf_counter() - t0, _say)  # a job that cannot finish says so
        if self.stop:
            raise RunInterrupted(self.stop.signum, self.ckdir)

    def _plateau_control(self, epoch: int) -> None:
        """After `epoch`'s validation: early stopping, and with ``followup.trigger: plateau`` (RSW
        App. D) the switch to phase 2. The first time patience runs out (before the epochs cap) the
        run does not stop: phase 2 starts at the next epoch from the current weights and optimizer
        state, the patience count starts again, and the next time it runs out the run stops;
        ``followup.epochs`` > 0 caps phase 2. ``state.followup_start`` (checkpointed with the
        position) is the first phase-2 epoch, None before the switch."""
        cfg, st = self.cfg, self.state
        f = cfg["followup"]
        plateau = f["trigger"] == "plateau"
        start = st.followup_start
        if self.validation.stopped:
            if plateau and start is None and epoch < cfg["epochs"]:
                self.validation.start_followup(st.global_step)
                st.followup_start = epoch + 1
                _say(f"validation plateaued after epoch {epoch}: followup phase from epoch {epoch + 1}")
            else:
                st.stopped = epoch
        elif (
            plateau and start is not None and f["epochs"] and epoch - start + 1 >= f["epochs"] and epoch < cfg["epochs"]
        ):
            st.stopped = epoch  # followup.epochs phase-2 epochs done (the schedule is closed at the finish)

    # -- the step and its device-side window (:class:`~dmlrepro.train.stepper.Stepper`) --------
    def open_window(self) -> None:
        self.stepper.open_window(self.state)

    def sync(self, epoch: int, lrs: dict[str, float]) -> dict[str, Any] | None:
        return self.stepper.sync(self.state, epoch, lrs)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.stepper.step(x, y, self.state.batch)

    # the names the loop calls (tests and the fault harness wrap them)
    _open_window, _sync, _step = open_window, sync, step

    # -- evaluation and outputs ---------------------------------------------------------------
    def _evaluate(self, epoch: int, final: bool = False) -> dict[str, float] | None:
        return self.test_eval(epoch, self.state, final)

    def _check_proxy_metrics(self) -> None:
        wanted = self.cfg["eval"]["proxy_metrics"]
        if not wanted:
            return
        try:
            _, labels = proxy_points(self.loss)
        except ValueError as error:
            raise ConfigError(f"run config: eval.proxy_metrics = {wanted!r}: {error}") from None
        if "avg_dtp" in wanted and len(labels) != len(self.labelmap):
            raise ConfigError(
                f"run config: eval.proxy_metrics = {wanted!r}: avg_dtp needs one proxy per class, "
                f"loss {self.cfg['loss']['name']!r} has {len(labels)} for {len(self.labelmap)} classes"
            )

    def _proxy_metrics(self) -> dict[str, float]:
        return proxy_metrics(self.cfg, self.embedder, self.train_eval_ds(), self.labelmap, self.loss)

    def _write_log(self) -> None:
        write_train_log(
            self.rundir,
            self.cfg,
            self.state,
            [g["name"] for g in self.optimizer.param_groups],
            self.validation is not None,
        )

    def _finish_completed(self) -> dict[str, Any]:
        select, last_epoch = self.cfg["eval"]["select"], self.state.stopped or self.cfg["epochs"]
        if self.validation is not None and not self.validation.stopped:
            # the epoch cap (or the phase-2 cap of a plateau-triggered followup) ended the run: close the
            # open projection's record
            self.validation.finish(self.state.global_step, "followup_epochs" if self.state.stopped else "max_epochs")
        if select == "best_val" and not self.rundir.embeddings().is_file():
            self._evaluate_best_val()
        if select == "best_test":
            for best, final in self.test_eval.files():
                if best.is_file():
                    os.replace(best, final)
        epoch = self._final_epoch(select, last_epoch)
        extra = {
            "status": "completed",
            "epoch": epoch,
            "diverged_at": None,
            "precision": self.precision(),
            **common_fields(self.cfg, self.state),
            **self._final_extras(last_epoch),
        }
        write_final_proxies(self.rundir, self.loss, self.labelmap.classes)  # the report's, before metrics.json
        res = final_metrics(self.outdir, self.cfg, extra)
        _say(f"completed: epoch {epoch} test recall@1 = {res['metrics']['recall@1']:.4f} ({self.outdir})")
        return res

    def precision(self) -> dict[str, str]:
        """metrics.json's `precision`: the device and the training and evaluation precisions."""
        tf32 = bool(self.cfg["speed"]["tf32"])
        return {
            "device": str(self.device),
            "train": precision_name(self.amp_dtype, self.device, tf32),
            "eval": EVAL_PRECISION,
        }

    def _final_epoch(self, select: str, last_epoch: int) -> int:
        """The epoch of the selected model's saved test embeddings (computed again when missing)."""
        emb_path = self.rundir.embeddings()
        try:
            epoch = int(load_embeddings(emb_path).meta.get("epoch", last_epoch))
            if self.cfg["dataset"]["gallery_split"]:
                load_embeddings(self.rundir.embeddings(gallery=True))
            return epoch
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
            # missing or damaged (e.g. truncated by a kill mid-write): with select "last" the model in memory is the
            # final one (best_val: the saved best model), and evaluation is deterministic, so the file
            # is simply computed again
            if select == "best_test" or (select == "last" and self.state.epoch != last_epoch + 1):
                raise FileNotFoundError(
                    f"{emb_path} is missing or damaged ({e}); run `dmlrepro evaluate {self.outdir}`"
                ) from None
            _say(
                f"{emb_path.name} is missing or damaged ({type(e).__name__}); computing it again from the "
                f"{'best-validation' if select == 'best_val' else 'final'} model"
            )
        if select == "best_val":
            return self._evaluate_best_val()
        if self._evaluate(last_epoch, True) is None:  # pragma: no cover - finite before
            raise RuntimeError(f"{self.outdir}: the final model's test embeddings are not finite")
        return last_epoch

    def _final_extras(self, last_epoch: int) -> dict[str, Any]:
        """Proxy metrics, corruption metrics and the validation summary of a completed run."""
        extra: dict[str, Any] = {}
        if self.cfg["eval"]["proxy_metrics"]:
            last = self.state.history[-1] if self.state.history else {}
            logged = last.get("proxy_metrics") if last.get("epoch") == last_epoch else None
            extra["proxy_metrics"] = logged if logged is not None else self._proxy_metrics()
        if self.cfg["eval"]["corruptions"]:  # RSW Table IV: the final model on corrupted test images
            extra["corruption_metrics"] = corruption_metrics(
                self.model, self.cfg, self.manifest, device=self.device, progress=self.progress, stop=self.stop
            )
        if self.validation is not None:
            extra["validation"] = self.validation.summary()
        return extra

    def _evaluate_best_val(self) -> int:
        """Load the best-validation model (eval.select best_val) and save its test embeddings; its epoch."""
        state = read_checkpoint(self.rundir.best_model("best_val"), map_location=self.device)
        self.model.load_state_dict(state["model"])
        if self._evaluate(int(state["epoch"]), True) is None:
            raise RuntimeError(f"{self.outdir}: the best-validation model's test embeddings are not finite")
        return int(state["epoch"])

    def _finish_diverged(self, info: dict[str, Any]) -> dict[str, Any]:
        st = self.state
        loss_mean = float("nan") if info["what"] != "embeddings" else st.epoch_loss_sum / max(st.epoch_steps, 1)
        st.history.append(self._row(info["epoch"], st.epoch_steps, loss_mean, info["lrs"], st.epoch_seconds, None))
        self._write_log()
        if self.validation is not None:
            self.validation.write_log()
        record = {**diverged_record(self.cfg, st, info), "precision": self.precision()}
        write_json_atomic(self.rundir.metrics, record)
        _say(
            f"diverged: non-finite {info['what']} at epoch {info['epoch']} step {info['step']}; "
            f"last finite evaluation: epoch {record['epoch']} ({self.rundir.metrics})"
        )
        return record


_Trainer = Trainer  # the name tests and older tools patch
