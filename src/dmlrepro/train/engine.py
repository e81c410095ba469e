"""The training engine: one resolved run config -> a trained model, its test embeddings and
metrics, in a run directory that can be interrupted and resumed at any point.

Run directory (docs/training.md, :class:`~dmlrepro.train.state.RunDir`): ``config.yaml``
(resolved), ``train_log.csv`` (one row per epoch, row 0 = the untrained network),
``embeddings_test.npz`` (the selected model's test embeddings, saved once), ``metrics.json`` and
``checkpoints/`` (resume only).

Shape: :class:`Trainer` is the epoch loop and the :class:`~dmlrepro.train.state.TrainState` it owns; it
holds the run's parts (``Trainer.parts``, a :class:`~dmlrepro.train.parts.RunParts`, the one place that
builds them: model, loss, optimizer, data, :class:`~dmlrepro.train.embedder.Embedder`, hooks,
:class:`~dmlrepro.train.stepper.Stepper`). ``_train_epoch`` (train_one_epoch) runs the steps (autocast,
GradScaler, clipping, divergence flags), then the after-epoch hooks (the validation callback
:class:`~dmlrepro.train.alternation.AlternationCallback` with ASAP's alternations, test evaluation,
proxy metrics), then the end of the epoch (logs, a checkpoint when the
:class:`~dmlrepro.train.hooks.CheckpointPolicy` says so, the job's time budget, :mod:`dmlrepro.budget`).
Checkpoint records and resuming are :mod:`.resume`'s; the reported model
(``eval.select``) and the completed record's extras are :mod:`.model_selection`'s. At the finish, a
loss with proxies exports them (``final_proxies.npz``) for the report.

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
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from dmlrepro.atomic import atomic_write_text, write_json_atomic
from dmlrepro.budget import warn_time_budget

from .checkpoint import load_latest
from .config import ConfigError, config_identity, dump_yaml, resolve_run_config
from .embedder import EmbeddingInterrupted
from .hooks import CheckpointPolicy
from .model_selection import select_model
from .outputs import common_fields, diverged_record, history_row, say as _say, write_final_proxies, write_train_log
from .parts import RunParts
from .preemption import RunInterrupted, StopFlag
from .resume import checkpoint_record, first_difference, restore_checkpoint, write_checkpoint
from .run_evaluation import final_metrics
from .runlock import run_lock
from .runtime import apply_speed, available_cpus, resolve_device, resolve_runtime, restore_speed
from .seeding import DeterminismGuard
from .state import RunDir, TrainState

__all__ = ["Trainer", "TrainState", "RunDir", "resolve_device", "train_run"]


def _stored_yaml(cfg: dict) -> Any:
    """The config as config.yaml stores it (its YAML round trip): what a run's identity is read from."""
    return yaml.safe_load(dump_yaml(cfg))


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
        with run_lock(outdir):
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
            # guards against resuming another run's checkpoints (resume.restore_checkpoint)
            _say(f"{cfg_path} is damaged ({type(e).__name__}); rewritten from the run config")
            old = stored_cfg
        if not isinstance(old, dict):
            raise ConfigError(
                f"{cfg_path}: expected a YAML mapping (the resolved run config), got "
                f"{type(old).__name__}; delete the file to resume"
            )
        diff = first_difference(config_identity(old), config_identity(stored_cfg))
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
                trainer.parts.close()
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
    """One run's epoch loop (:meth:`run`) and the :class:`TrainState` it owns, over the run's ``parts``
    (:class:`~dmlrepro.train.parts.RunParts`: model, loss, optimizer, data, hooks, Stepper). The preflight and
    benchmarks/bench_training.py time the loop's pieces: :meth:`for_measurement`, :meth:`start_epoch`, :meth:`step`."""

    def __init__(self, cfg: dict, stored_cfg: dict, outdir: Path, progress: bool, stop: StopFlag | None):
        self.parts = RunParts(cfg, RunDir(outdir), progress, stop)
        self.cfg, self.stored_cfg, self.settings, self.stop = cfg, stored_cfg, self.parts.settings, stop
        self.rundir, self.ckdir = self.parts.rundir, self.parts.rundir.checkpoints
        self.state = TrainState()
        self.policy = CheckpointPolicy(self.settings.checkpoint_overhead, self.settings.checkpoint_floor_mb)
        self.open_window()  # reopened at every epoch's start (from the restored position)

    @classmethod
    def for_measurement(cls, cfg: dict, outdir: Path) -> Trainer:
        """A trainer outside a run (no stop flag, no progress bars): preflight and benchmarks."""
        return cls(cfg, _stored_yaml(cfg), outdir, False, None)

    # -- checkpoints (:mod:`.resume`) -----------------------------------------------------------
    def _record(self) -> dict[str, Any]:
        return checkpoint_record(self.stored_cfg, self.state, **self.parts.checkpointed())

    def _save(self, snapshot: dict[str, Any] | None = None) -> Path:
        make = self._record if snapshot is None else (lambda: snapshot)
        return write_checkpoint(self.ckdir, make, self.settings.checkpoint_keep, self.policy)

    def _restore(self, record: dict[str, Any], path: Path) -> None:
        parts, amp = self.parts.checkpointed(), self.settings.amp_enabled
        self.state = restore_checkpoint(record, path, self.stored_cfg, self.ckdir, amp, **parts)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        had_files = any(self.ckdir.glob("ckpt-*.pt")) if self.ckdir.is_dir() else False
        found = load_latest(self.ckdir, map_location="cpu")
        if found is not None:
            self._restore(*found)
            # train_log.csv from the checkpointed history: a rerun whose log was removed (Snakemake deletes
            # a job's outputs before rerunning it) or damaged gets it back even when no epoch runs
            if self.state.history:
                self._write_log(validation=False)
        else:
            if had_files:
                _say("no usable checkpoint left; restarting the run from scratch")
            self._interruptible(self._start)
        for epoch in range(self.state.epoch, self.settings.epochs + 1):
            if self.state.stopped:  # validation early stopping
                break
            diverged = self._train_epoch(epoch)
            if diverged:
                return self._finish_diverged(diverged)
        return self._interruptible(self._finish_completed)

    def _start(self) -> None:
        """Before the first epoch: the callback's start (ASAP's first proxies), the untrained network's log row 0."""
        if self.parts.alternation is not None:
            self.parts.alternation.on_train_start()
        if self.settings.before_training:
            t0 = time.perf_counter()
            metrics = self._evaluate(0)
            seconds = time.perf_counter() - t0
            proxy = self.parts.epoch_proxy_metrics(metrics)
            self.state.history.append(self._row(0, 0, None, None, seconds, metrics, proxy))

    def _interruptible(self, fn, snapshot: dict[str, Any] | None = None):
        """``fn()``; a preemption signal while it embeds ends the run with exit 75 after
        checkpointing `snapshot` (the state before `fn` began; None: the last checkpoint stands,
        `fn` runs again on resume)."""
        try:
            return fn()
        except EmbeddingInterrupted:
            path = self._save(snapshot) if snapshot is not None else self.ckdir
            raise RunInterrupted(self.stop.signum, path) from None

    def start_epoch(self, epoch: int) -> dict[str, float]:
        """Position at `epoch`'s start, its settings applied, model and loss in train mode; the groups' lrs."""
        self.state.epoch, self.state.batch = epoch, 0
        return self.parts.train_mode(epoch, self.state.followup_start)

    def _train_epoch(self, epoch: int) -> dict[str, Any] | None:
        """train_one_epoch: the steps from the position on, then the after-epoch hooks; None or a divergence record."""
        st = self.state
        lrs = self.parts.train_mode(epoch, st.followup_start)
        t0 = time.perf_counter()
        bad = self._train_steps(epoch, lrs, t0)
        st.epoch_seconds += time.perf_counter() - t0
        if bad:
            return bad
        snapshot = self._record()  # what a signal during the hooks checkpoints: they run again on resume
        outcome = self._interruptible(lambda: self._after_epoch(epoch, lrs), snapshot)
        if outcome is None:
            self._end_epoch(epoch, t0)
        return outcome

    def _train_steps(self, epoch: int, lrs: dict[str, float], t0: float) -> dict[str, Any] | None:
        """The epoch's optimizer steps from the position on; the host reads the device's loss and
        flags every ``speed.sync_every`` steps. A signal: checkpoint after the step, RunInterrupted."""
        st, every = self.state, self.settings.sync_every
        bar = self.parts.epoch_bar(epoch, st.batch)
        self.open_window()
        with contextlib.closing(bar):
            for x, y, _ in bar:
                self.step(x, y)
                st.batch += 1
                st.global_step += 1
                st.epoch_steps += 1
                self.stop.step_done()
                if st.batch % every == 0 or self.stop:
                    bad = self.sync(epoch, lrs)
                    if bad:
                        return bad
                    if self.parts.progress and st.batch % 10 == 0:
                        bar.set_postfix(loss=f"{st.epoch_loss_sum / st.epoch_steps:.4g}")
                if self.stop:
                    st.epoch_seconds += time.perf_counter() - t0
                    raise RunInterrupted(self.stop.signum, self._save())
        return self.sync(epoch, lrs)

    def _after_epoch(self, epoch: int, lrs: dict[str, float]) -> dict[str, Any] | None:
        """The hooks: the validation callback (early stopping, followup, ASAP), test evaluation,
        proxy metrics; then the epoch's history row. None, or the divergence record of non-finite embeddings."""
        st, parts, val_metrics, metrics = self.state, self.parts, None, None
        if parts.alternation is not None:
            val_metrics = parts.alternation.after_epoch(epoch, st)
            if val_metrics is None:
                return self._nonfinite(epoch, "validation embeddings", lrs)
        final = epoch == self.settings.epochs or bool(st.stopped)
        if parts.test_eval.due(epoch, final):
            metrics = self._evaluate(epoch, final)
            if metrics is None:
                return self._nonfinite(epoch, "embeddings", lrs)
        loss_mean = st.epoch_loss_sum / max(st.epoch_steps, 1)
        proxy = parts.epoch_proxy_metrics(metrics)
        row = self._row(epoch, st.epoch_steps, loss_mean, lrs, st.epoch_seconds, metrics, proxy, val_metrics)
        st.history.append(row)
        return None

    def _nonfinite(self, epoch: int, what: str, lrs: dict[str, float]) -> dict[str, Any]:
        """The divergence record of non-finite embeddings after `epoch`'s steps."""
        return dict(epoch=epoch, step=self.state.batch, global_step=self.state.global_step, what=what, lrs=lrs)

    def _end_epoch(self, epoch: int, t0: float) -> None:
        """The position moves on; logs; a checkpoint when the policy (or the last epoch, or a
        signal) asks for one; a signal ends the run (exit 75)."""
        final = epoch == self.settings.epochs or bool(self.state.stopped)
        self.state.next_epoch()
        self._write_log()
        if final or self.stop or self.policy.due():
            self._save()
        warn_time_budget(self.cfg, epoch, time.perf_counter() - t0, _say)  # a job that cannot finish says so
        if self.stop:
            raise RunInterrupted(self.stop.signum, self.ckdir)

    # -- the step and its device-side window (:class:`~dmlrepro.train.stepper.Stepper`) --------
    def open_window(self) -> None:
        self.parts.stepper.open_window(self.state)

    def sync(self, epoch: int, lrs: dict[str, float]) -> dict[str, Any] | None:
        return self.parts.stepper.sync(self.state, epoch, lrs)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.parts.stepper.step(x, y, self.state.batch)

    def _evaluate(self, epoch: int, final: bool = False) -> dict[str, float] | None:
        return self.parts.test_eval(epoch, self.state, final)

    def _row(self, epoch, steps, loss, lrs, seconds, metrics, proxy_metrics=None, val_metrics=None) -> dict[str, Any]:
        return history_row(self.cfg, self.state, epoch, steps, loss, lrs, seconds, metrics, proxy_metrics, val_metrics)

    def _write_log(self, validation: bool = True) -> None:
        """train_log.csv and (`validation`) validation_log.json."""
        names = [g["name"] for g in self.parts.optimizer.param_groups]
        write_train_log(self.rundir, self.cfg, self.state, names, self.parts.validation is not None)
        if validation and self.parts.alternation is not None:
            self.parts.alternation.write_log()

    def _finish_completed(self) -> dict[str, Any]:
        st, parts, last_epoch = self.state, self.parts, self.state.stopped or self.settings.epochs
        if parts.alternation is not None:
            parts.alternation.on_train_end(st)
        evaluation = dict(test_eval=parts.test_eval, evaluate=self._evaluate, model=parts.model, device=parts.device)
        epoch = select_model(self.settings, self.rundir, st, **evaluation)
        extra = {"status": "completed", "epoch": epoch, "diverged_at": None, "precision": parts.precision()}
        extra |= common_fields(self.cfg, st) | parts.final_extras(st, last_epoch)
        write_final_proxies(self.rundir, parts.loss, parts.labelmap.classes)  # the report's, before metrics.json
        res = final_metrics(self.rundir.root, self.cfg, extra)
        _say(f"completed: epoch {epoch} test recall@1 = {res['metrics']['recall@1']:.4f} ({self.rundir.root})")
        return res

    def _finish_diverged(self, info: dict[str, Any]) -> dict[str, Any]:
        st = self.state
        loss_mean = float("nan") if info["what"] != "embeddings" else st.epoch_loss_sum / max(st.epoch_steps, 1)
        st.history.append(self._row(info["epoch"], st.epoch_steps, loss_mean, info["lrs"], st.epoch_seconds, None))
        self._write_log()
        record = {**diverged_record(self.cfg, st, info), "precision": self.parts.precision()}
        write_json_atomic(self.rundir.metrics, record)
        _say(
            f"diverged: non-finite {info['what']} at epoch {info['epoch']} step {info['step']}; "
            f"last finite evaluation: epoch {record['epoch']} ({self.rundir.metrics})"
        )
        return record
