"""The keys of a resolved run config that the training loop and its parts read, as one frozen,
typed record built once per run (:meth:`RunSettings.of`). The values are the config's own (no
conversion); the config itself is unchanged and still goes, whole, to the builders that own a
section (data, model, loss, optimizer, Stepper, hooks). Meanings: docs/training.md's key table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunSettings:
    seed: int
    epochs: int
    steps_per_epoch: int | None
    num_workers: int
    batch_size: int  # dataset.batch_size
    eval_batch_size: int  # dataset.eval_batch_size
    loss_name: str  # loss.name
    validated: bool  # a validation.split is set
    asap: bool  # asap.enabled
    sample_proxies: bool  # asap.enabled with asap.proxies: samples (eq. 4.10)
    followup_loss: Mapping[str, Any]  # followup.loss: loss attributes of phase 2
    followup_trigger: str  # followup.trigger
    followup_epochs: int  # followup.epochs
    amp_enabled: bool | str  # amp.enabled: true, false or "auto"
    select: str  # eval.select
    before_training: bool  # eval.before_training
    proxy_metrics: list[str]  # eval.proxy_metrics
    proxy_metrics_per_epoch: bool  # eval.proxy_metrics_per_epoch
    corruptions: list[Any]  # eval.corruptions
    gallery: bool  # a dataset.gallery_split is set
    checkpoint_keep: int  # checkpoint.keep
    sync_every: int  # speed.sync_every
    channels_last: bool  # speed.channels_last
    tf32: bool  # speed.tf32
    image_cache_mb: float  # speed.image_cache_mb
    checkpoint_overhead: float  # speed.checkpoint_overhead
    checkpoint_floor_mb: float  # speed.checkpoint_floor_mb

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> RunSettings:
        """The settings of a resolved run config (runtime keys made concrete: ``resolve_runtime``)."""
        d, e, f, speed = cfg["dataset"], cfg["eval"], cfg["followup"], cfg["speed"]
        return cls(
            seed=cfg["seed"],
            epochs=cfg["epochs"],
            steps_per_epoch=cfg["steps_per_epoch"],
            num_workers=cfg["num_workers"],
            batch_size=d["batch_size"],
            eval_batch_size=d["eval_batch_size"],
            loss_name=cfg["loss"]["name"],
            validated=bool(cfg["validation"]["split"]),
            asap=bool(cfg["asap"]["enabled"]),
            sample_proxies=bool(cfg["asap"]["enabled"]) and cfg["asap"]["proxies"] == "samples",
            followup_loss=f["loss"],
            followup_trigger=f["trigger"],
            followup_epochs=f["epochs"],
            amp_enabled=cfg["amp"]["enabled"],
            select=e["select"],
            before_training=e["before_training"],
            proxy_metrics=e["proxy_metrics"],
            proxy_metrics_per_epoch=e["proxy_metrics_per_epoch"],
            corruptions=e["corruptions"],
            gallery=bool(d["gallery_split"]),
            checkpoint_keep=cfg["checkpoint"]["keep"],
            sync_every=speed["sync_every"],
            channels_last=speed["channels_last"],
            tf32=bool(speed["tf32"]),
            image_cache_mb=speed["image_cache_mb"],
            checkpoint_overhead=speed["checkpoint_overhead"],
            checkpoint_floor_mb=speed["checkpoint_floor_mb"],
        )
