"""The parts of one run, built once from its resolved config, and what they do per epoch.

:class:`RunParts` builds, in this order (the RNG streams depend on it): the model (from the run's
seed), the data (manifest, datasets, the seeded batch sampler), the loss (from its own seed
stream), the optimizer's groups, the :class:`~dmlrepro.train.embedder.Embedder` and the
after-epoch hooks (ASAP's :class:`~dmlrepro.train.projections.Projections`, the
:class:`~dmlrepro.train.validation.Validation` hook and its
:class:`~dmlrepro.train.alternation.AlternationCallback`, :class:`~dmlrepro.train.hooks.TestEvaluation`),
the :class:`~dmlrepro.train.stepper.Stepper` and the shared image cache. Per epoch it sets the lrs,
the followup's loss attributes and the trainability (warm-up, BN freeze); it owns the training
DataLoader (built once, persistent workers). The :class:`~dmlrepro.train.engine.Trainer` holds these
parts (``Trainer.parts``) and runs the loop over them.
"""

from __future__ import annotations

from typing import Any

import torch
from tqdm import tqdm

from dmlrepro.losses import proxy_points, use_sample_proxies

from .alternation import AlternationCallback
from .config import ConfigError
from .embedder import Embedder
from .hooks import TestEvaluation, proxy_metrics
from .imagecache import attach as attach_image_cache, share_image_cache
from .model_and_loss import build_run_loss, build_run_model
from .model_selection import final_extras
from .optim import apply_trainability, build_optimizer, group_lrs, in_followup, linked_groups, named_groups, set_lrs
from .outputs import say as _say
from .precision import precision_record, training_amp_dtype
from .preemption import StopFlag
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
from .runtime import run_device
from .seeding import loss_seed, seed_everything
from .settings import RunSettings
from .state import RunDir, TrainState
from .stepper import Stepper
from .validation import Validation


class RunParts:
    """Model, loss, optimizer, data and loaders, Embedder, hooks and Stepper of one run."""

    def __init__(self, cfg: dict, rundir: RunDir, progress: bool, stop: StopFlag | None):
        self.cfg, self.rundir, self.progress, self.stop = cfg, rundir, progress, stop
        self.settings = s = RunSettings.of(cfg)
        self.device = run_device(cfg)  # resolved once, by resolve_runtime
        amp_dtype = training_amp_dtype(cfg, self.device)  # training only: evaluation is float32
        seed_everything(s.seed)  # model init from the run's seed (a bad model config fails before the data)
        self.model = build_run_model(cfg)
        self._build_data()
        # the loss's init (proxies) from its own stream: independent of whatever preparing the data did
        torch.manual_seed(loss_seed(s.seed))
        self.loss = build_run_loss(cfg, len(self.labelmap), self.model.embedding_size)
        if s.sample_proxies:
            use_sample_proxies(self.loss)  # eq. 4.10: proxies = embedded samples, no trainable proxy parameter
        self._check_proxy_metrics()
        self._to_device()
        self.phase1_attrs = {k: getattr(self.loss, k) for k in s.followup_loss}
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
            amp_dtype=amp_dtype,
        )
        # cache_images: one decoded copy of each image for every loader worker of the run
        self.image_cache = share_image_cache(
            [self.train_ds, self.test_ds, getattr(self.validation, "ds", None)],
            s.image_cache_mb,
            _say if stop is not None else (lambda _msg: None),
        )

    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The training steps' autocast dtype (None: float32); a resume keeps the checkpoint's."""
        return self.stepper.amp_dtype

    def _build_data(self) -> None:
        cfg, s = self.cfg, self.settings
        self.manifest = manifest = open_manifest(cfg["dataset"])  # refuses a truncated manifest (data layer)
        self.train_ds, self.test_ds, self.labelmap = build_datasets(
            cfg["dataset"], manifest, self.model, cfg["validation"]
        )
        self._train_eval_ds = None
        self.gallery_ds = build_gallery(cfg["dataset"], manifest, self.model)
        self.sampler = SeededBatchSampler(
            build_batch_sampler(cfg["dataset"], self.train_ds, s.seed), s.seed, s.steps_per_epoch
        )
        if self.sampler.num_batches() == 0:
            raise ConfigError(
                f"run config: dataset.batch_size = {s.batch_size}: an epoch has no "
                f"full batch of the {len(self.train_ds)} training images"
            )
        self._loader: torch.utils.data.DataLoader | None = None

    def _to_device(self) -> None:
        self.model.to(self.device)
        if self.settings.channels_last:  # NHWC activations (tensor cores); the batches follow in the Stepper
            self.model.to(memory_format=torch.channels_last)
        self.loss.to(self.device)
        self.labelmap.table = self.labelmap.table.to(self.device)

    def _build_hooks(self) -> None:
        """The Embedder and the after-epoch hooks: validation (with ASAP's projections), test evaluation."""
        cfg, s = self.cfg, self.settings
        self.embedder = Embedder(
            self.model,
            self.device,
            batch_size=s.eval_batch_size,
            num_workers=s.num_workers,
            progress=self.progress,
            stop=self.stop,
        )
        self.projections = None
        if s.asap:
            self.projections = Projections(
                cfg,
                model=self.model,
                loss=self.loss,
                optimizer=self.optimizer,
                embedder=self.embedder,
                train_ds=self.train_ds,
                train_eval_ds=self.train_eval_ds,
                labelmap=self.labelmap,
            )
        self.validation = self.alternation = None
        if s.validated:
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
            self.alternation = AlternationCallback(self.validation, self.projections, s)
        self.test_eval = TestEvaluation(
            cfg,
            test_ds=self.test_ds,
            gallery_ds=self.gallery_ds,
            model=self.model,
            embedder=self.embedder,
            rundir=self.rundir,
        )

    def _check_proxy_metrics(self) -> None:
        wanted = self.settings.proxy_metrics
        if not wanted:
            return
        try:
            _, labels = proxy_points(self.loss)
        except ValueError as error:
            raise ConfigError(f"run config: eval.proxy_metrics = {wanted!r}: {error}") from None
        if "avg_dtp" in wanted and len(labels) != len(self.labelmap):
            raise ConfigError(
                f"run config: eval.proxy_metrics = {wanted!r}: avg_dtp needs one proxy per class, "
                f"loss {self.settings.loss_name!r} has {len(labels)} for {len(self.labelmap)} classes"
            )

    def train_eval_ds(self):
        """The run's training images with the eval transform (built once)."""
        if self._train_eval_ds is None:
            rows = self.train_ds.rows if self.validation is not None else None
            self._train_eval_ds = build_train_eval(self.cfg["dataset"], self.manifest, self.model, rows)
            attach_image_cache(self.image_cache, self._train_eval_ds)
        return self._train_eval_ds

    def proxy_metrics(self) -> dict[str, float]:
        """eval.proxy_metrics of the current proxies and model (W₂, AvgDTP)."""
        return proxy_metrics(self.cfg, self.embedder, self.train_eval_ds(), self.labelmap, self.loss, self.optimizer)

    def epoch_proxy_metrics(self, metrics: dict[str, float] | None) -> dict[str, float] | None:
        """eval.proxy_metrics at an evaluated epoch whose test embeddings were finite, when
        eval.proxy_metrics_per_epoch asks for them (RSW Fig. 9)."""
        if metrics is None or not self.settings.proxy_metrics_per_epoch:
            return None
        return self.proxy_metrics()

    def apply_epoch_settings(self, epoch: int, followup_start: int | None = None) -> dict[str, float]:
        """`epoch`'s lrs, followup loss attributes and trainability (`followup_start`: the first
        phase-2 epoch of a plateau-triggered followup, None before the switch); the groups' lrs."""
        cfg = self.cfg
        set_lrs(self.optimizer, group_lrs(cfg, epoch, followup_start))
        attrs = self.settings.followup_loss if in_followup(cfg, epoch, followup_start) else self.phase1_attrs
        for k, v in attrs.items():
            setattr(self.loss, k, v)
        apply_trainability(cfg, self.model, self.loss, epoch)
        return {g["name"]: g["lr"] for g in self.optimizer.param_groups}

    def train_mode(self, epoch: int, followup_start: int | None) -> dict[str, float]:
        """`epoch`'s settings applied, model and loss in train mode; the groups' lrs."""
        lrs = self.apply_epoch_settings(epoch, followup_start)
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
            nw = self.settings.num_workers
            self._loader = torch.utils.data.DataLoader(
                SeededDataset(self.train_ds),
                batch_sampler=self.sampler,
                num_workers=nw,
                persistent_workers=nw > 0,
                worker_init_fn=worker_init if nw else None,
                generator=loader_generator(self.settings.seed, epoch, 1),
                pin_memory=self.device.type == "cuda",
            )
        return self._loader

    def checkpointed(self) -> dict[str, Any]:
        """The parts a checkpoint records, by the names :mod:`.resume` takes them."""
        return {
            "model": self.model,
            "loss": self.loss,
            "optimizer": self.optimizer,
            "stepper": self.stepper,
            "validation": self.validation,
            "projections": self.projections,
        }

    def final_extras(self, state: TrainState, last_epoch: int) -> dict[str, Any]:
        """A completed run's proxy metrics, corruption metrics and validation summary (:mod:`.model_selection`)."""
        return final_extras(
            self.cfg,
            self.settings,
            state,
            last_epoch,
            proxy_metrics=self.proxy_metrics,
            validation=self.validation,
            model=self.model,
            manifest=self.manifest,
            device=self.device,
            progress=self.progress,
            stop=self.stop,
        )

    def epoch_bar(self, epoch: int, start_batch: int) -> tqdm:
        """:meth:`epoch_loader` in a progress bar (shown with `progress`)."""
        return tqdm(
            self.epoch_loader(epoch, start_batch),
            total=self.sampler.num_batches(),
            initial=start_batch,
            disable=not self.progress,
            desc=f"epoch {epoch}/{self.settings.epochs}",
            leave=False,
            dynamic_ncols=True,
        )

    def precision(self) -> dict[str, Any]:
        """metrics.json's `precision` (:func:`~dmlrepro.train.precision.precision_record`)."""
        return precision_record(self.amp_dtype, self.device, self.settings.tf32, self.loss)

    def close(self) -> None:
        """Stop the worker processes of the run's loaders."""
        self.embedder.close()
        it = getattr(self._loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._loader = None
