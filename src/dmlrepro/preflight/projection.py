"""What a reproduction will cost: each run's hours from its shape's measured speed, compared with
the time SLURM gives it, summed per experiment and in total; and what a training job adds to its
environment for the same check inside the job after its first full epoch (:func:`job_budget_env`;
the check is :func:`dmlrepro.budget.warn_time_budget`).

A run's hours (docs/preflight.md#projection)::

    epochs × steps per epoch × step time  +  evaluated images × embedding time
      +  k-NN searches  +  ASAP k-Center selections

* steps per epoch: the training images (the benchmark's count from ``dmlrepro.data.benchmarks``,
  or the prepared manifest's; less the validation classes' share) over the batch size, or the
  sampler's ``length_before_new_iter``, capped by ``steps_per_epoch``;
* step time: the measured step at the run's batch size (scaled per image when the preflight ran a
  smaller ``--batch-size``); the data pipeline's time per batch where it is slower (overlapped by
  the DataLoader's workers, added without them);
* evaluated images: the test split (and gallery) at every test evaluation, the validation classes
  after every epoch, the training split for proxy metrics, the test split per image corruption;
* embedding time: seconds per image of the measured embedding loop; the data pipeline's where it is
  slower (overlapped by the DataLoader's workers, added without them), as for the step time;
* k-NN searches: every evaluation's queries × references × embedding size × the seconds per such
  unit that one search of the project's k-NN (``knn_search``, at the run's largest k) took on this
  device (:func:`measure_knn`);
* k-Center selections (ASAP): 1 + at most one alternation per ``projection_patience`` epochs
  (capped by ``max_alternations``), each embedding the pools (C × pool size images at the
  embedding time) and running the farthest-first traversal, timed on this device for the run's
  pool size, P and embedding size on a few classes and scaled to C (:func:`measure_kcenter`).

The budget of a run is its training job's time limit ``resources.train`` runtime (per dataset,
as rule train requests it) × (the SLURM profile's retries + 1); a search's job trains trials ×
folds runs in one allocation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlrepro.budget import TIME_LIMIT_ENV
from dmlrepro.job_requests import train_request

#: rule train's built-in runtime request (minutes) under resources.train.default / <dataset>


@dataclass
class Speed:
    """A shape's measured speed: seconds per step at ``batch_size``, the data pipeline's and the
    embedding loop's (on batches in memory) images per second, and the DataLoader's worker count."""

    step_seconds: float
    batch_size: int
    data_images_per_second: float
    eval_images_per_second: float
    workers: int


@dataclass
class RunCost:
    run_id: str
    experiments: list[str]
    hours: float
    budget_hours: float

    @property
    def over_budget(self) -> bool:
        return self.hours > self.budget_hours


# -- sizes -------------------------------------------------------------------------------------
def validation_share(cfg: Mapping[str, Any]) -> float:
    """The share of the training images that validate (0 without a validation split)."""
    v = cfg.get("validation") or {}
    split = v.get("split")
    if split is None:
        return 0.0
    if split == "fold":
        return 1.0 / v["n_folds"]
    if split == "holdout":
        return 0.5
    return float(v.get("fraction", 0.1))  # split samples


def steps_per_epoch(cfg: Mapping[str, Any], train_images: int) -> int:
    d = cfg["dataset"]
    images = round(train_images * (1 - validation_share(cfg)))
    if d["sampler"] == "m_per_class" and d.get("length_before_new_iter"):
        images = d["length_before_new_iter"]
    steps = max(images, d["batch_size"]) // d["batch_size"]
    return min(steps, cfg["steps_per_epoch"]) if cfg.get("steps_per_epoch") else steps


def planned_images(cfg: Mapping[str, Any], train_images: int, runs: int = 1) -> int:
    """The most images a training job trains on: epochs × :func:`steps_per_epoch` × batch size × `runs`
    (a search's trials × folds); the scheduler starts the largest first (job_requests.train_priority)."""
    return cfg["epochs"] * steps_per_epoch(cfg, train_images) * cfg["dataset"]["batch_size"] * runs


def count_test_evaluations(cfg: Mapping[str, Any]) -> int:
    """How often the engine embeds the test split: the untrained row 0, every ``eval.every``-th
    epoch and the last (best_val: once, the restored best model)."""
    e, epochs = cfg["eval"], cfg["epochs"]
    if e["select"] == "best_val":
        during = 1
    else:
        during = len({epochs} | (set(range(e["every"], epochs + 1, e["every"])) if e["every"] else set()))
    return int(e["before_training"]) + during


def evaluated_images(cfg: Mapping[str, Any], counts: Mapping[str, int]) -> int:
    """Images the run embeds for evaluation over its whole life (module docstring)."""
    d, e = cfg["dataset"], cfg["eval"]
    test = counts.get(f"{d['test_split']}_images", 0) + (
        counts.get(f"{d['gallery_split']}_images", 0) if d.get("gallery_split") else 0
    )
    images = count_test_evaluations(cfg) * test
    images += round(counts.get("train_images", 0) * validation_share(cfg)) * cfg["epochs"]
    if e.get("proxy_metrics"):
        images += counts.get("train_images", 0) * (
            count_test_evaluations(cfg) if e.get("proxy_metrics_per_epoch") else 1
        )
    images += len(e.get("corruptions") or []) * counts.get(f"{d['test_split']}_images", 0)
    return images


# -- hours --------------------------------------------------------------------------------------
def step_time(cfg: Mapping[str, Any], speed: Speed) -> float:
    """Seconds per optimizer step of the run (module docstring)."""
    batch = cfg["dataset"]["batch_size"]
    compute = speed.step_seconds * batch / speed.batch_size
    data = batch / speed.data_images_per_second
    return max(compute, data) if speed.workers > 0 else compute + data


def embedding_time(speed: Speed) -> float:
    """Seconds per embedded image (module docstring): the embedding loop's own speed is measured on
    batches in memory, so the data pipeline's time is overlapped or added here."""
    compute, data = 1.0 / speed.eval_images_per_second, 1.0 / speed.data_images_per_second
    return max(compute, data) if speed.workers > 0 else compute + data


def run_hours(
    cfg: Mapping[str, Any],
    counts: Mapping[str, int],
    speed: Speed,
    knn_seconds_per_unit: float = 0.0,
    kcenter_seconds: Callable[[int, int, int, int], float] | None = None,
    train_classes: int | None = None,
) -> float:
    """The run's hours (module docstring); without the k-NN rate or the k-Center timer those parts are 0."""
    train = cfg["epochs"] * steps_per_epoch(cfg, counts["train_images"]) * step_time(cfg, speed)
    per_image = embedding_time(speed)
    evaluation = evaluated_images(cfg, counts) * per_image
    search = knn_units(cfg, counts) * knn_seconds_per_unit
    selections = 0.0
    if kcenter_seconds is not None and train_classes and kcenter_selections(cfg):
        pool, p, dim = kcenter_pool(cfg)
        per_selection = train_classes * pool * per_image + kcenter_seconds(train_classes, pool, p, dim)
        selections = kcenter_selections(cfg) * per_selection
    return (train + evaluation + search + selections) / 3600.0


# -- evaluation k-NN and ASAP k-Center ------------------------------------------------------------------
def knn_units(cfg: Mapping[str, Any], counts: Mapping[str, int]) -> int:
    """Σ queries × references × embedding size over the run's k-NN searches (module docstring)."""
    d, e, dim = cfg["dataset"], cfg["eval"], cfg["model"]["embedding_size"]
    queries = counts.get(f"{d['test_split']}_images", 0)
    references = counts.get(f"{d['gallery_split']}_images", 0) if d.get("gallery_split") else queries
    validation = round(counts.get("train_images", 0) * validation_share(cfg))
    units = count_test_evaluations(cfg) * queries * references
    units += cfg["epochs"] * validation * validation
    units += len(e.get("corruptions") or []) * queries * references
    return units * dim


def kcenter_pool(cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    """(pool size per class, P, embedding size) of an ASAP run's k-Center selections."""
    from dmlrepro.asap.kcenter import pool_size  # deferred: imports torch

    p = int(cfg["loss"]["hparams"]["proxies_per_class"])
    a = cfg["asap"]
    return pool_size(int(a["b"]), p, a.get("small_budget", "times_p")), p, int(cfg["model"]["embedding_size"])


def kcenter_selections(cfg: Mapping[str, Any]) -> int:
    """k-Center selections of a run: 0 without ASAP; else the initial one and at most one alternation
    per ``projection_patience`` epochs, capped by ``max_alternations`` (the schedule decides; a bound)."""
    a = cfg.get("asap") or {}
    if not a.get("enabled"):
        return 0
    alternations = cfg["epochs"] // max(1, int(a.get("projection_patience") or 1)) if a.get("alternate", True) else 0
    if a.get("max_alternations") is not None:
        alternations = min(alternations, int(a["max_alternations"]))
    return 1 + alternations


def measure_knn(dim: int, k: int, device: str, queries: int = 1024, references: int = 4096) -> float:
    """Seconds per query × reference × dimension of one ``knn_search`` on random embeddings on ``device``."""
    import torch  # deferred: this module imports without torch (the train job script)

    from dmlrepro.evaluation.knn import knn_search  # deferred: imports torch

    g = torch.Generator().manual_seed(0)
    q, r = torch.randn(queries, dim, generator=g), torch.randn(references, dim, generator=g)
    q, r = q.to(device), r.to(device)
    knn_search(q[:64], min(k, references), r, device=device)  # warm-up (backend choice, kernels)
    start = time.perf_counter()
    knn_search(q, min(k, references), r, device=device)
    return (time.perf_counter() - start) / (queries * references * dim)


def measure_kcenter(classes: int, pool: int, p: int, dim: int, device: str, timed_classes: int = 16) -> float:
    """Seconds of the farthest-first traversal (``asap.kcenter.farthest_first``, seeded with P centres)
    for ``classes`` classes: timed on ``timed_classes`` of them on ``device``, scaled linearly."""
    import torch  # deferred: this module imports without torch (the train job script)

    from dmlrepro.asap.kcenter import farthest_first  # deferred: imports torch

    g = torch.Generator().manual_seed(0)
    n = min(classes, timed_classes)
    pools = torch.randn(n, pool, dim, generator=g).to(device)
    seeds = torch.randn(n, p, dim, generator=g).to(device)
    start = time.perf_counter()
    farthest_first(pools, min(p, pool), seeds)
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * classes / n


def budget_hours(config: Mapping[str, Any], dataset: str, retries: int, runs_in_job: int = 1) -> float:
    """The time a run may take: its job's time limit × (retries + 1), shared by the job's runs."""
    return train_request(config, dataset)["runtime"] * (retries + 1) / 60.0 / runs_in_job


def profile_retries(profile: str | os.PathLike) -> int | None:
    """``retries`` of a Snakemake profile's config.yaml (a folder or the file), None if absent."""
    import yaml  # deferred: the train job script imports this module, and only this reader needs yaml

    path = Path(profile)
    path = path / "config.yaml" if path.is_dir() else path
    if not path.is_file():
        return None
    return int((yaml.safe_load(path.read_text()) or {}).get("retries", 0))


def summarize(costs: list[RunCost], members: Mapping[str, list[str]]) -> tuple[list[dict[str, Any]], float]:
    """([{name, runs, hours}] per experiment, total hours): a run shared by experiments counts in
    each of them and once in the total."""
    hours = {cost.run_id: cost.hours for cost in costs}
    experiments = [
        {"name": name, "runs": list(run_ids), "hours": sum(hours.get(i, 0.0) for i in run_ids)}
        for name, run_ids in members.items()
    ]
    return experiments, sum(hours.values())


# -- inside a training job ------------------------------------------------------------------------
def job_budget_env(runtime_minutes: int | float, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What a training job adds to its environment so that the engine can check its speed: its
    time limit, only inside a SLURM job (a local run has no limit)."""
    return {TIME_LIMIT_ENV: str(runtime_minutes)} if environ.get("SLURM_JOB_ID") else {}
