"""The training engine: one resolved run config -> a trained model, its test embeddings and
metrics, in a run directory that can be interrupted and resumed at any point.

Run directory (docs/training.md): ``config.yaml`` (resolved), ``train_log.csv`` (one row per epoch,
row 0 = the untrained network), ``embeddings_test.npz`` (the selected model's test
embeddings, saved once), ``metrics.json`` and ``checkpoints/`` (resume only).

Resume protocol: a checkpoint is written at the end of every epoch and, on SIGTERM/SIGUSR1/SIGUSR2,
after the current optimizer step (then :class:`RunInterrupted`; the CLI exits 75). A restarted
``train_run`` on the same directory loads the newest valid checkpoint -- model, loss parameters,
optimizer, GradScaler, every RNG state, epoch, batch index within the epoch, the epoch's
running loss and the history -- and continues; on CPU with ``deterministic: true`` the final
weights and metrics equal those of an uninterrupted run bit for bit (tests/train/test_resume.py).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import logging
import os
import socket
import time
import zipfile
from pathlib import Path
from typing import Any

import torch
import yaml

from dmlrepro.atomic import atomic_write_text, write_json_atomic
from dmlrepro.preflight.projection import warn_time_budget

from .checkpoint import load_latest, save_checkpoint, write_verified
from .config import ConfigError, config_identity, dump_yaml, resolve_run_config
from .data import (SeededBatchSampler, SeededDataset, build_batch_sampler, build_datasets, build_gallery, build_train_eval,
                   build_validation, loader_generator, open_manifest, worker_init)
from .evaluate import BEST_MODEL_FILE, EMBEDDINGS_FILE, GALLERY_FILE, compute_embeddings, embedding_metrics, final_metrics
from .modeling import build_run_loss, build_run_model
from .optim import (apply_trainability, base_group, build_optimizer, group_lrs, in_followup, linked_groups, named_groups,
                    set_lrs)
from .preemption import RunInterrupted, StopFlag
from .projections import Projections
from .runtime import apply_speed, available_cpus, resolve_runtime, restore_speed
from .seeding import DeterminismGuard, loss_seed, rng_state, seed_everything, set_rng_state
from .validation import BEST_VAL_MODEL_FILE, Validation

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
BEST_EMBEDDINGS_FILE = "best_test.npz"
BEST_GALLERY_FILE = "best_gallery.npz"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"run config: device = {name!r}: expected a device that exists (no CUDA GPU is visible); "
                          f"use 'auto' or 'cpu'")
    return dev


def all_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A device bool: no inf/NaN in any of `tensors`, in two fused kernels (x·0 is NaN exactly
    where x is not finite; the norm of each product is 0 or NaN), without a host sync."""
    return torch.isfinite(torch.stack(torch._foreach_norm(torch._foreach_mul(tensors, 0.0))).sum())


def _say(msg: str) -> None:
    log.info(msg)
    print(f"dmlrepro train: {msg}", flush=True)


def _plain_yaml(cfg: dict) -> Any:
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
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        blocker = next((p for p in outdir.parents if p.exists()), outdir)
        kind = "is a file" if blocker.is_file() else "is not writable"
        raise ConfigError(f"OUTDIR {outdir}: cannot create the run folder ({error.strerror}; {blocker} {kind}); "
                          f"expected a writable folder path") from error
    with _run_lock(outdir):
        return _train_locked(cfg, outdir, progress)


@contextlib.contextmanager
def _run_lock(outdir: Path):
    """One process at a time per run directory (``<outdir>/.lock``, an ``flock`` the kernel
    releases when its holder dies, even by SIGKILL). Fault injection (tests/faults) found the
    case: SIGKILL the Snakemake controller, its train jobs live on as orphans, and the rerun
    starts a second trainer on the same folder; the two then deleted each other's checkpoint
    temporaries. Now the second one waits for the first, then finds its finished run."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(outdir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)  # beside, not in, checkpoints/
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            _say(f"{outdir} is being trained by another process (pid {holder}); waiting for it to end")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in _NO_FLOCK:
                raise
            _say(f"{outdir}: flock is not supported here ({error.strerror}); using the lock file {_LOCK_FILE}")
            with _lock_file(outdir / _LOCK_FILE):
                yield
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


#: flock errors of filesystems without flock support (Lustre without ``-o flock``, some NFS)
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_LOCK_FILE = ".lock.pid"


@contextlib.contextmanager
def _lock_file(path: Path, poll: float = 5.0):
    """An exclusive lock file (``O_CREAT | O_EXCL``) holding ``pid host``, removed on exit. A file
    left by a dead process of this host is stale and taken over; one of another host (whose pids
    cannot be checked from here) is waited for: delete it by hand if that host is gone."""
    me = f"{os.getpid()} {socket.gethostname()}"
    said = False
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            holder = path.read_text(errors="replace").strip() if path.exists() else ""
            pid, _, host = holder.partition(" ")
            if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
                _say(f"{path}: stale lock of dead process {pid} on {host}; taken over")
                path.unlink(missing_ok=True)
                continue
            if not said:
                _say(f"{path.parent} is being trained by another process ({holder or '?'}); waiting for it to end")
                said = True
            time.sleep(poll)
    try:
        os.write(fd, f"{me}\n".encode())
        os.fsync(fd)
        os.close(fd)
        yield
    finally:
        if path.exists() and path.read_text(errors="replace").strip() == me:
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _train_locked(cfg: dict, outdir: Path, progress: bool | None) -> dict[str, Any]:
    # temporaries of atomic writes (.NAME.RANDOM.tmp) left by a process killed mid-write; with
    # the run lock held no other process is writing here (found by tests/faults)
    for stale in [*outdir.glob(".*.tmp"), *(outdir / "checkpoints").glob(".*.tmp")]:
        stale.unlink(missing_ok=True)
    plain = _plain_yaml(cfg)
    cfg_path = outdir / "config.yaml"
    if cfg_path.is_file():
        try:
            old = yaml.safe_load(cfg_path.read_text()) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            # damaged (we write it atomically): rewritten; a checkpoint's own config record still
            # guards against resuming another run's checkpoints (_Trainer._restore)
            _say(f"{cfg_path} is damaged ({type(e).__name__}); rewritten from the run config")
            old = plain
        if not isinstance(old, dict):
            raise ConfigError(f"{cfg_path}: expected a YAML mapping (the resolved run config), got "
                              f"{type(old).__name__}; delete the file to resume")
        diff = _first_difference(config_identity(old), config_identity(plain))
        if diff:
            raise ConfigError(f"{outdir} holds a run with a different config ({diff}); "
                              f"use another output directory or delete this one")
    # num_workers / threads / deterministic as this process uses them (runtime keys: config.yaml records them)
    asked = cfg["threads"]  # the workflow's job CPUs
    cfg = resolve_runtime(cfg, resolve_device(cfg["device"]))
    atomic_write_text(cfg_path, dump_yaml(cfg))
    mpath = outdir / "metrics.json"
    record = _finished_record(mpath)
    if record is not None:
        _say(f"{outdir}: already finished ({record['status']}); nothing to do")
        return record
    if progress is None:
        progress = os.isatty(2)
    _say(f"{available_cpus()} CPUs available (threads asked: {asked}): num_workers {cfg['num_workers']}, "
         f"torch threads {cfg['threads'] or torch.get_num_threads()}, deterministic {cfg['deterministic']}")
    prev = apply_speed(cfg["speed"], cfg["deterministic"])
    try:
        with DeterminismGuard(cfg["deterministic"], cfg["threads"]), StopFlag() as stop:
            return _Trainer(cfg, plain, outdir, bool(progress), stop).run()
    finally:
        restore_speed(prev)


def _finished_record(mpath: Path) -> dict[str, Any] | None:
    """The record of a finished run, or None. A metrics.json that does not parse or lacks the
    fields every finished record has (half-written by a foreign, non-atomic writer, or damaged)
    is not trusted: it is removed, with a message, and the run is finished again from its
    checkpoints (fault injection, tests/faults: a truncated metrics.json used to stop the run
    with a bare JSON error)."""
    if not mpath.is_file():
        return None
    try:
        record = json.loads(mpath.read_text())
        problem = None
        if not isinstance(record, dict):
            problem = "not a JSON object"
        elif record.get("status") not in ("completed", "diverged"):
            problem = f"status {record.get('status')!r}"
        elif not isinstance(record.get("metrics"), dict) or (record["status"] == "completed" and "recall@1" not in record["metrics"]):
            problem = "no metrics"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        problem = f"unreadable: {e}"
    if problem is None:
        return record
    _say(f"{mpath} is incomplete or damaged ({problem}); removed, finishing the run from its checkpoints")
    mpath.unlink(missing_ok=True)
    return None


class _Trainer:
    def __init__(self, cfg: dict, plain: dict, outdir: Path, progress: bool, stop: StopFlag):
        self.cfg, self.plain, self.outdir, self.progress, self.stop = cfg, plain, outdir, progress, stop
        self.ckdir = outdir / "checkpoints"
        self.device = resolve_device(cfg["device"])
        amp = cfg["amp"]
        # autocast on CUDA and on the CPU alike (bfloat16, or float16 with the GradScaler)
        use_amp = (amp["enabled"] == "auto" and self.device.type == "cuda") or amp["enabled"] is True
        self.amp_dtype = getattr(torch, amp["dtype"]) if use_amp else None

        seed_everything(cfg["seed"])  # model init from the run's seed (a bad model config fails before the data)
        self.model = build_run_model(cfg)
        self.manifest = manifest = open_manifest(cfg["dataset"])  # refuses a truncated manifest (data layer)
        self.train_ds, self.test_ds, self.labelmap = build_datasets(cfg["dataset"], manifest, self.model,
                                                                    cfg["validation"])
        self._train_eval_ds = None
        self.gallery_ds = build_gallery(cfg["dataset"], manifest, self.model)
        # the loss's init (proxies) from its own stream: independent of whatever preparing the data did
        torch.manual_seed(loss_seed(cfg["seed"]))
        self.loss = build_run_loss(cfg, len(self.labelmap), self.model.embedding_size)
        if cfg["asap"]["enabled"] and cfg["asap"]["proxies"] == "samples":
            self.loss.use_sample_proxies()  # eq. 4.10: proxies = embedded samples, no trainable proxy parameter
        self._check_proxy_metrics()
        self.model.to(self.device)
        if cfg["speed"]["channels_last"]:  # NHWC activations (tensor cores); the batches follow in _step
            self.model.to(memory_format=torch.channels_last)
        self.loss.to(self.device)
        self.labelmap.table = self.labelmap.table.to(self.device)
        self.phase1_attrs = {k: getattr(self.loss, k) for k in cfg["followup"]["loss"]}
        self.groups = named_groups(self.model, self.loss)
        self.optimizer = build_optimizer(cfg, self.groups, linked_groups(self.loss))
        self.scaler = self._new_scaler()
        self.sampler = SeededBatchSampler(build_batch_sampler(cfg["dataset"], self.train_ds, cfg["seed"]),
                                          cfg["seed"], cfg["steps_per_epoch"])
        if self.sampler.num_batches() == 0:
            raise ConfigError(f"run config: dataset.batch_size = {cfg['dataset']['batch_size']}: an epoch has no "
                              f"full batch of the {len(self.train_ds)} training images")
        self.clip_params = [p for g, params in self.groups.items() if base_group(g) in cfg["grad_clip"]["groups"]
                            for p in params]
        self.projections = Projections(self) if cfg["asap"]["enabled"] else None
        self.validation = (Validation(self, build_validation(cfg["dataset"], cfg["validation"], manifest, self.model))
                           if cfg["validation"]["split"] else None)
        self.pos: dict[str, Any] = {"epoch": 1, "batch": 0, "global_step": 0, "epoch_loss_sum": 0.0,
                                    "epoch_steps": 0, "epoch_seconds": 0.0, "history": [], "best": None}
        self._open_window()  # reopened at every epoch's start (from the restored position)

    def _new_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)

    def train_eval_ds(self):
        """The run's training images with the eval transform (built once)."""
        if self._train_eval_ds is None:
            rows = self.train_ds.rows if self.validation is not None else None
            self._train_eval_ds = build_train_eval(self.cfg["dataset"], self.manifest, self.model, rows)
        return self._train_eval_ds

    # -- state -------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state = {"format": CHECKPOINT_FORMAT, "config": config_identity(self.plain), "position": dict(self.pos),
                 "model": self.model.state_dict(), "loss": self.loss.state_dict(),
                 "optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(), "rng": rng_state(),
                 "amp_dtype": str(self.amp_dtype).removeprefix("torch.") if self.amp_dtype else None}
        if self.validation is not None:
            state["validation"] = self.validation.state_dict()
        if self.projections is not None:
            state["projections"] = self.projections.state_dict()
        return state

    def _save(self) -> Path:
        return save_checkpoint(self.ckdir, self._state(), self.pos["epoch"], self.pos["batch"], self.cfg["checkpoint"]["keep"])

    def _restore(self, state: dict[str, Any], path: Path) -> None:
        # config_identity of the stored identity too: keys that became runtime keys later drop out of both
        diff = _first_difference(config_identity(state.get("config") or {}), config_identity(self.plain))
        if state.get("format") != CHECKPOINT_FORMAT or diff:
            raise ConfigError(f"checkpoint {path} belongs to another config ({diff or 'format'}); "
                              f"use another output directory or delete {self.ckdir}")
        self._restore_amp(state, path)
        self.model.load_state_dict(state["model"])
        self.loss.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state["scaler"] or not self.scaler.is_enabled():  # an enabled scaler refuses an empty state
            self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.pos = dict(state["position"])
        if self.validation is not None:
            self.validation.load_state_dict(state["validation"])
        if self.projections is not None:
            self.projections.load_state_dict(state["projections"])
        _say(f"resuming from {path.name} (epoch {self.pos['epoch']}, batch {self.pos['batch']})")

    def _restore_amp(self, state: dict[str, Any], path: Path) -> None:
        """Resume in the autocast dtype the checkpoint trained with: ``amp.enabled: auto`` resolves
        by device, so a run moved between CPU and CUDA keeps the checkpoint's dtype (with a message)."""
        if "amp_dtype" not in state:  # written before the dtype was recorded
            return
        saved = getattr(torch, state["amp_dtype"]) if state["amp_dtype"] else None
        if saved == self.amp_dtype:
            return
        if self.cfg["amp"]["enabled"] != "auto":  # pragma: no cover - amp.* is part of the identity
            raise ConfigError(f"checkpoint {path}: amp.enabled = {self.cfg['amp']['enabled']!r} trained with "
                              f"autocast {state['amp_dtype']}, now {self.amp_dtype}; delete {self.ckdir} to restart")
        _say(f"amp.enabled = auto: keeping the checkpoint's autocast dtype {state['amp_dtype'] or 'off (float32)'} "
             f"on {self.device} (it trained with it)")
        self.amp_dtype = saved
        self.scaler = self._new_scaler()

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        had_files = any(self.ckdir.glob("ckpt-*.pt")) if self.ckdir.is_dir() else False
        found = load_latest(self.ckdir, map_location="cpu")
        if found is not None:
            self._restore(*found)
            # the log is rebuilt from the checkpointed history: a rerun whose train_log.csv was
            # removed (Snakemake deletes a job's declared outputs before rerunning it) or damaged
            # gets it back even when the checkpoint is the final one and no epoch runs
            # (tests/faults: --rerun-incomplete after a killed controller failed with MissingOutput)
            if self.pos["history"]:
                self._write_log()
        else:
            if had_files:
                _say("no usable checkpoint left; restarting the run from scratch")
            if self.projections is not None:  # Alg. 1: the first proxies by k-Center from random samples
                self.validation.record_selection(self.projections.initialize())
            if self.cfg["eval"]["before_training"]:
                t0 = time.perf_counter()
                metrics = self._evaluate(0)
                self.pos["history"].append(self._row(0, 0, None, None, time.perf_counter() - t0, metrics,
                                                     self._epoch_proxy_metrics(metrics)))
        for epoch in range(self.pos["epoch"], self.cfg["epochs"] + 1):
            if self.pos.get("stopped"):  # validation early stopping
                break
            diverged = self._train_epoch(epoch)
            if diverged:
                return self._finish_diverged(diverged)
        return self._finish_completed()

    def _row(self, epoch, steps, loss, lrs, seconds, metrics, proxy_metrics=None, val_metrics=None) -> dict[str, Any]:
        row = {"epoch": epoch, "steps": steps, "loss": loss, "lrs": lrs, "seconds": seconds,
               "phase": 2 if epoch and in_followup(self.cfg, epoch, self.pos.get("followup_start")) else 1,
               "test_metrics": metrics}
        if proxy_metrics is not None:  # only with eval.proxy_metrics_per_epoch (older histories lack the key)
            row["proxy_metrics"] = proxy_metrics
        if val_metrics is not None:  # only with a validation split
            row["val_metrics"] = val_metrics
        return row

    def _epoch_proxy_metrics(self, metrics: dict[str, float] | None) -> dict[str, float] | None:
        """eval.proxy_metrics of the current proxies and model, at an evaluated epoch whose test
        embeddings were finite, when eval.proxy_metrics_per_epoch asks for them (RSW Fig. 9)."""
        if metrics is None or not self.cfg["eval"]["proxy_metrics_per_epoch"]:
            return None
        return self._proxy_metrics()

    def _apply_epoch_settings(self, epoch: int) -> dict[str, float]:
        cfg = self.cfg
        start = self.pos.get("followup_start")  # followup.trigger plateau: the epoch phase 2 began (None: not yet)
        lrs = group_lrs(cfg, epoch, start)
        set_lrs(self.optimizer, lrs)
        attrs = cfg["followup"]["loss"] if in_followup(cfg, epoch, start) else self.phase1_attrs
        for k, v in attrs.items():
            setattr(self.loss, k, v)
        apply_trainability(cfg, self.model, self.loss, epoch)
        return {g["name"]: g["lr"] for g in self.optimizer.param_groups}

    def epoch_loader(self, epoch: int, start_batch: int = 0) -> torch.utils.data.DataLoader:
        """The training DataLoader of ``epoch`` from batch ``start_batch`` (the preflight and
        benchmarks/bench_training.py build theirs here too)."""
        self.sampler.set_epoch(epoch, start_batch)
        nw = self.cfg["num_workers"]
        return torch.utils.data.DataLoader(
            SeededDataset(self.train_ds), batch_sampler=self.sampler, num_workers=nw,
            worker_init_fn=worker_init if nw else None, generator=loader_generator(self.cfg["seed"], epoch, 1),
            pin_memory=self.device.type == "cuda")

    def _train_epoch(self, epoch: int) -> dict[str, Any] | None:
        from tqdm import tqdm

        cfg, pos = self.cfg, self.pos
        lrs = self._apply_epoch_settings(epoch)
        self.model.train()
        self.loss.train()
        loader = self.epoch_loader(epoch, pos["batch"])
        t0 = time.perf_counter()
        bar = tqdm(loader, total=self.sampler.num_batches(), initial=pos["batch"], disable=not self.progress,
                   desc=f"epoch {epoch}/{cfg['epochs']}", leave=False, dynamic_ncols=True)
        self._open_window()
        every = cfg["speed"]["sync_every"]
        for x, y, _ in bar:
            self._step(x, y)
            pos["batch"] += 1
            pos["global_step"] += 1
            pos["epoch_steps"] += 1
            self.stop.step_done()
            if pos["batch"] % every == 0 or self.stop:  # the host reads the device's loss and flags
                bad = self._sync(epoch, lrs)
                if bad:
                    pos["epoch_seconds"] += time.perf_counter() - t0
                    return bad
                if self.progress and pos["batch"] % 10 == 0:
                    bar.set_postfix(loss=f"{pos['epoch_loss_sum'] / pos['epoch_steps']:.4g}")
            if self.stop:
                pos["epoch_seconds"] += time.perf_counter() - t0
                path = self._save()
                bar.close()
                raise RunInterrupted(self.stop.signum, path)
        bar.close()
        bad = self._sync(epoch, lrs)
        pos["epoch_seconds"] += time.perf_counter() - t0
        if bad:
            return bad
        val_metrics = None
        if self.validation is not None:
            val_metrics = self.validation.evaluate(epoch)
            if val_metrics is None:
                return {"epoch": epoch, "step": pos["batch"], "global_step": pos["global_step"],
                        "what": "validation embeddings", "lrs": lrs}
            self._plateau_control(epoch)
        final = epoch == cfg["epochs"] or bool(pos.get("stopped"))
        every = cfg["eval"]["every"]
        metrics = None
        # with best_val the final test evaluation is of the restored best model (_finish_completed)
        if (final and cfg["eval"]["select"] != "best_val") or (every and epoch % every == 0):
            metrics = self._evaluate(epoch, final)
            if metrics is None:
                return {"epoch": epoch, "step": pos["batch"], "global_step": pos["global_step"],
                        "what": "embeddings", "lrs": lrs}
        loss_mean = pos["epoch_loss_sum"] / max(pos["epoch_steps"], 1)
        pos["history"].append(self._row(epoch, pos["epoch_steps"], loss_mean, lrs, pos["epoch_seconds"], metrics,
                                        self._epoch_proxy_metrics(metrics), val_metrics))
        pos.update(epoch=epoch + 1, batch=0, epoch_loss_sum=0.0, epoch_steps=0, epoch_seconds=0.0)
        self._write_log()
        if self.validation is not None:
            self.validation.write_log()
        self._save()
        warn_time_budget(cfg, epoch, time.perf_counter() - t0, _say)  # a job that cannot finish says so (docs/preflight.md)
        if self.stop:
            raise RunInterrupted(self.stop.signum, self.ckdir)
        return None

    def _plateau_control(self, epoch: int) -> None:
        """After `epoch`'s validation: early stopping, and with ``followup.trigger: plateau`` (RSW
        App. D) the switch to phase 2. The first time patience runs out (before the epochs cap) the
        run does not stop: phase 2 starts at the next epoch from the current weights and optimizer
        state, the patience count starts again, and the next time it runs out the run stops;
        ``followup.epochs`` > 0 caps phase 2. ``pos["followup_start"]`` (checkpointed with the
        position) is the first phase-2 epoch, absent before the switch."""
        cfg, pos = self.cfg, self.pos
        f = cfg["followup"]
        plateau = f["trigger"] == "plateau"
        start = pos.get("followup_start")
        if self.validation.stopped:
            if plateau and start is None and epoch < cfg["epochs"]:
                self.validation.start_followup()
                pos["followup_start"] = epoch + 1
                _say(f"validation plateaued after epoch {epoch}: followup phase from epoch {epoch + 1}")
            else:
                pos["stopped"] = epoch
        elif plateau and start is not None and f["epochs"] and epoch - start + 1 >= f["epochs"] \
                and epoch < cfg["epochs"]:
            pos["stopped"] = epoch  # followup.epochs phase-2 epochs done (the schedule is closed at the finish)

    def _open_window(self) -> None:
        """Device-side state between two host syncs: the epoch's loss sum (float64, added in the
        order a host float would be) and the first non-finite step's kind (1 loss, 2 gradients) and batch."""
        self._loss_sum = torch.tensor(self.pos["epoch_loss_sum"], dtype=torch.float64, device=self.device)
        self._bad = torch.zeros(2, dtype=torch.int64, device=self.device)

    def _sync(self, epoch: int, lrs: dict[str, float]) -> dict[str, Any] | None:
        """One host read of the window: the loss sum into the position, or the divergence record of
        the first non-finite step (the position set back to just before it; later steps are void)."""
        loss_sum, kind, batch = torch.cat([self._loss_sum.view(1), self._bad.double()]).tolist()
        if not kind:
            self.pos["epoch_loss_sum"] = loss_sum
            return None
        pos = self.pos
        void = pos["batch"] - int(batch)  # the bad step and those after it in the window
        pos["batch"] -= void
        pos["global_step"] -= void
        pos["epoch_steps"] -= void
        return {"epoch": epoch, "step": pos["batch"] + 1, "global_step": pos["global_step"] + 1,
                "what": "loss" if kind == 1 else "gradients", "lrs": lrs}

    def _flag(self, bad: torch.Tensor, kind: int) -> None:
        """Record (kind, this batch) on the device if `bad` and no earlier step of the window was."""
        first, at = self._bad.unbind()
        new = bad & (first == 0)
        self._bad = torch.stack([torch.where(new, kind, first), torch.where(new, self.pos["batch"], at)])

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One optimizer step, without waiting for the device: a non-finite loss or gradient is
        flagged on the device (:meth:`_flag`) and found by the next :meth:`_sync`."""
        dev = self.device
        x = x.to(dev, non_blocking=True)
        if self.cfg["speed"]["channels_last"]:
            x = x.contiguous(memory_format=torch.channels_last)
        y = self.labelmap(y.to(dev, non_blocking=True))
        self.optimizer.zero_grad(set_to_none=True)
        anchors = self.projections.anchor_images() if self.projections is not None and self.projections.samples else None
        with torch.autocast(dev.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
            if anchors is None:
                emb = self.model(x)
            else:  # sample-based ASAP (eq. 4.10): the selected samples in the batch's forward pass
                emb, z = self.model(torch.cat([x, anchors.to(x.dtype)])).split([len(x), len(anchors)])
        with torch.autocast(dev.type, enabled=False):  # the loss always runs in float32
            loss = self.loss(emb.float(), y) if anchors is None else self.loss(emb.float(), y, proxies=z.float())
        value = loss.detach()
        self._flag(~torch.isfinite(value), 1)
        if anchors is not None:
            self.projections.record_anchors(z)
        self.scaler.scale(loss).backward()
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)  # inf/NaN gradients: the scaler skips the step
        if self.projections is not None:  # ASAP's proximal term λ_eff(θ − θ*), after unscaling
            self.projections.after_backward()
        if not self.scaler.is_enabled() and self.cfg["divergence"]["check_grads"]:
            grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            if grads:
                self._flag(~all_finite(grads), 2)
        clip = self.cfg["grad_clip"]["value"]
        if clip is not None:
            torch.nn.utils.clip_grad_value_([p for p in self.clip_params if p.grad is not None], clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._loss_sum += value.double()

    # -- evaluation and outputs ---------------------------------------------------------------
    def _evaluate(self, epoch: int, final: bool = False) -> dict[str, float] | None:
        from dmlrepro.evaluation import save_embeddings

        cfg = self.cfg
        sets = [(self.test_ds, cfg["dataset"]["test_split"], EMBEDDINGS_FILE, BEST_EMBEDDINGS_FILE)]
        if self.gallery_ds is not None:
            sets.append((self.gallery_ds, cfg["dataset"]["gallery_split"], GALLERY_FILE, BEST_GALLERY_FILE))
        embedded = [compute_embeddings(self.model, ds, batch_size=cfg["dataset"]["eval_batch_size"],
                                       device=self.device, num_workers=cfg["num_workers"], amp_dtype=self.amp_dtype,
                                       progress=self.progress, desc=f"eval {split} epoch {epoch}", on_device=True)
                    for ds, split, _, _ in sets]
        (emb, labels, _), gallery = embedded[0], embedded[1][:2] if len(embedded) > 1 else None
        metrics = embedding_metrics(emb, labels, cfg, gallery)
        if metrics is None:
            return None

        def save(folder: Path, best: bool, meta: dict) -> None:
            for (_, split, name, best_name), (e, y, rows) in zip(sets, embedded):
                save_embeddings(folder / (best_name if best else name), e, y, rows, split=split, meta=meta)

        if cfg["eval"]["select"] == "best_test" and epoch > 0:
            best = self.pos["best"]
            if best is None or metrics["recall@1"] > best["recall@1"]:
                self.pos["best"] = {"epoch": epoch, "recall@1": metrics["recall@1"]}
                save(self.ckdir, True, {"epoch": epoch, "select": "best_test"})
                write_verified(self.ckdir / BEST_MODEL_FILE, {"epoch": epoch, "model": self.model.state_dict()})
        elif final:
            save(self.outdir, False, {"epoch": epoch, "select": cfg["eval"]["select"]})
        return metrics

    def _check_proxy_metrics(self) -> None:
        from dmlrepro.losses import proxy_points

        wanted = self.cfg["eval"]["proxy_metrics"]
        if not wanted:
            return
        try:
            _, labels = proxy_points(self.loss)
        except ValueError as error:
            raise ConfigError(f"run config: eval.proxy_metrics = {wanted!r}: {error}") from None
        if "avg_dtp" in wanted and len(labels) != len(self.labelmap):
            raise ConfigError(f"run config: eval.proxy_metrics = {wanted!r}: avg_dtp needs one proxy per class, "
                              f"loss {self.cfg['loss']['name']!r} has {len(labels)} for {len(self.labelmap)} classes")

    def _proxy_metrics(self) -> dict[str, float]:
        """W₂ (PFML Table 3) and AvgDTP (RSW Table III) of the final proxies against the training split,
        embedded with the eval transform (docs/readings/pfml.md#pfml-r24, RSW-R15)."""
        from dmlrepro.evaluation import avg_dtp, proxy_data_w2
        from dmlrepro.losses import proxy_points

        cfg = self.cfg
        ds = self.train_eval_ds()
        emb, labels, _ = compute_embeddings(self.model, ds, batch_size=cfg["dataset"]["eval_batch_size"],
                                            device=self.device, num_workers=cfg["num_workers"],
                                            amp_dtype=self.amp_dtype, progress=self.progress, desc="embed train")
        labels = self.labelmap(torch.as_tensor(labels)).numpy()
        proxies, proxy_labels = (t.cpu().numpy() for t in proxy_points(self.loss))
        out = {}
        if "w2" in cfg["eval"]["proxy_metrics"]:
            out["w2"] = proxy_data_w2(emb, labels, proxies, proxy_labels, w_power=cfg["eval"]["w_power"])
        if "avg_dtp" in cfg["eval"]["proxy_metrics"]:
            out["avg_dtp"] = avg_dtp(emb, labels, proxies, proxy_labels)
        return out

    def _write_log(self) -> None:
        names = [g["name"] for g in self.optimizer.param_groups]
        # per-epoch proxy metrics (RSW Fig. 9's AvgDTP): one column each, only when asked for
        per_epoch = list(self.cfg["eval"]["proxy_metrics"]) if self.cfg["eval"]["proxy_metrics_per_epoch"] else []
        val = [self.cfg["validation"]["metric"]] if self.validation is not None else []  # val_map@r
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["epoch", "phase", "steps", "loss", *[f"lr_{n}" for n in names], "seconds", "test_recall@1",
                    *per_epoch, *[f"val_{n}" for n in val]])
        for r in self.pos["history"]:
            lrs = r["lrs"] or {}
            m = r["test_metrics"]
            pm = r.get("proxy_metrics") or {}
            w.writerow([r["epoch"], r["phase"], r["steps"], "" if r["loss"] is None else repr(float(r["loss"])),
                        *[repr(lrs[n]) if n in lrs else "" for n in names], f"{r['seconds']:.3f}",
                        "" if not m else repr(m["recall@1"]), *[repr(pm[n]) if n in pm else "" for n in per_epoch],
                        *[repr(r["val_metrics"][n]) if r.get("val_metrics") else "" for n in val]])
        atomic_write_text(self.outdir / "train_log.csv", buf.getvalue())

    def _last_finite(self) -> tuple[int | None, dict[str, float], dict[str, float] | None]:
        """Epoch, test metrics and (when logged per epoch) proxy metrics of the last finite evaluation."""
        for r in reversed(self.pos["history"]):
            if r["test_metrics"]:
                return r["epoch"], r["test_metrics"], r.get("proxy_metrics")
        return None, {}, None

    def _common(self) -> dict[str, Any]:
        hist = self.pos["history"]
        untrained = hist[0]["test_metrics"] if hist and hist[0]["epoch"] == 0 else None
        common = {"select": self.cfg["eval"]["select"], "epochs": self.cfg["epochs"],
                  "global_steps": self.pos["global_step"], "untrained_metrics": untrained,
                  "best_epoch": (self.pos["best"] or {}).get("epoch"), "stopped_epoch": self.pos.get("stopped")}
        if self.cfg["followup"]["trigger"] == "plateau":  # the first phase-2 epoch (null: never switched)
            common["followup_start_epoch"] = self.pos.get("followup_start")
        return common

    def _finish_completed(self) -> dict[str, Any]:
        from dmlrepro.evaluation.embeddings_io import load_embeddings

        emb_path = self.outdir / EMBEDDINGS_FILE
        select, last_epoch = self.cfg["eval"]["select"], self.pos.get("stopped") or self.cfg["epochs"]
        if self.validation is not None and not self.validation.stopped:
            # the epoch cap (or the phase-2 cap of a plateau-triggered followup) ended the run: close the
            # open projection's record
            self.validation.finish("followup_epochs" if self.pos.get("stopped") else "max_epochs")
        if select == "best_val" and not emb_path.is_file():
            self._evaluate_best_val()
        if select == "best_test":
            for best, final in ((BEST_GALLERY_FILE, GALLERY_FILE), (BEST_EMBEDDINGS_FILE, EMBEDDINGS_FILE)):
                if (self.ckdir / best).is_file():  # the queries' file last: its presence marks both moved
                    os.replace(self.ckdir / best, self.outdir / final)
        try:
            epoch = int(load_embeddings(emb_path).meta.get("epoch", last_epoch))
            if self.cfg["dataset"]["gallery_split"]:
                load_embeddings(self.outdir / GALLERY_FILE)
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
            # missing or damaged (fault injection, tests/faults: a truncated embeddings_test.npz used
            # to end the run with a bare BadZipFile): with select "last" the model in memory is the
            # final one (best_val: the saved best model), and evaluation is deterministic, so the file
            # is simply computed again
            if select == "best_test" or (select == "last" and self.pos["epoch"] != last_epoch + 1):
                raise FileNotFoundError(f"{emb_path} is missing or damaged ({e}); "
                                        f"run `dmlrepro evaluate {self.outdir}`") from None
            _say(f"{emb_path.name} is missing or damaged ({type(e).__name__}); computing it again from the "
                 f"{'best-validation' if select == 'best_val' else 'final'} model")
            epoch = self._evaluate_best_val() if select == "best_val" else last_epoch
            if select == "last" and self._evaluate(last_epoch, True) is None:  # pragma: no cover - finite before
                raise RuntimeError(f"{self.outdir}: the final model's test embeddings are not finite") from None
        extra = {"status": "completed", "epoch": epoch, "diverged_at": None, **self._common()}
        if self.cfg["eval"]["proxy_metrics"]:
            last = self.pos["history"][-1] if self.pos["history"] else {}
            logged = last.get("proxy_metrics") if last.get("epoch") == last_epoch else None
            extra["proxy_metrics"] = logged if logged is not None else self._proxy_metrics()
        if self.cfg["eval"]["corruptions"]:  # RSW Table IV: the final model on corrupted test images
            from .evaluate import corruption_metrics

            extra["corruption_metrics"] = corruption_metrics(self.model, self.cfg, self.manifest, device=self.device,
                                                             amp_dtype=self.amp_dtype, progress=self.progress)
        if self.validation is not None:
            extra["validation"] = self.validation.summary()
        res = final_metrics(self.outdir, self.cfg, extra)
        _say(f"completed: epoch {epoch} test recall@1 = {res['metrics']['recall@1']:.4f} ({self.outdir})")
        return res

    def _evaluate_best_val(self) -> int:
        """Load the best-validation model (eval.select best_val) and save its test embeddings; its epoch."""
        from .checkpoint import read_checkpoint

        state = read_checkpoint(self.ckdir / BEST_VAL_MODEL_FILE, map_location=self.device)
        self.model.load_state_dict(state["model"])
        if self._evaluate(int(state["epoch"]), True) is None:
            raise RuntimeError(f"{self.outdir}: the best-validation model's test embeddings are not finite")
        return int(state["epoch"])

    def _finish_diverged(self, info: dict[str, Any]) -> dict[str, Any]:

        pos = self.pos
        loss_mean = float("nan") if info["what"] != "embeddings" else pos["epoch_loss_sum"] / max(pos["epoch_steps"], 1)
        pos["history"].append(self._row(info["epoch"], pos["epoch_steps"], loss_mean, info["lrs"],
                                        pos["epoch_seconds"], None))
        self._write_log()
        if self.validation is not None:
            self.validation.write_log()
        epoch, metrics, proxy = self._last_finite()
        record = {"status": "diverged", "epoch": epoch, "metrics": metrics,
                  "diverged_at": {k: info[k] for k in ("epoch", "step", "global_step", "what")},
                  "distance": self.cfg["eval"]["distance"], "ks": self.cfg["eval"]["ks"],
                  "split": self.cfg["dataset"]["test_split"], **self._common()}
        if proxy is not None:  # the proxy metrics of that same last finite evaluation (RSW Table III)
            record["proxy_metrics"] = proxy
        write_json_atomic(self.outdir / "metrics.json", record)
        _say(f"diverged: non-finite {info['what']} at epoch {info['epoch']} step {info['step']}; "
             f"last finite evaluation: epoch {epoch} ({self.outdir}/metrics.json)")
        return record
