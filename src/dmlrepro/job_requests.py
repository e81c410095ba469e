"""A training job's requests to the scheduler (resources.train in the workflow config): the rules'
resources, the preflight's budget and its job use the same merge."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: a training job's built-in requests to the scheduler, under resources.train.default / <dataset>
TRAIN_REQUEST_DEFAULTS = {"runtime": 60, "mem_mb": 4000, "gpu": 0, "cpus": 1}


def check_train_requests(config: Mapping[str, Any]) -> None:
    """resources.train names only `default` and datasets of the config."""
    requests = (config.get("resources") or {}).get("train") or {}
    unknown = sorted(set(requests) - {"default"} - set(config["datasets"]))
    if unknown:
        raise ValueError(
            f"config resources.train.{unknown[0]}: expected 'default' or a key of datasets "
            f"({', '.join(sorted(config['datasets']))})"
        )


def train_request(config: Mapping[str, Any], dataset: str, search: Mapping[str, Any] | None = None) -> dict:
    """A training job's requests to the scheduler (runtime in minutes, mem_mb, gpu, cpus: the job's
    threads, warning: seconds of notice before the time limit): resources.train.<dataset> over
    resources.train.default over TRAIN_REQUEST_DEFAULTS. A search job (`search`: its `search:`
    block) trains trials × folds runs one after the other: its runtime is that many times longer."""
    requests = (config.get("resources") or {}).get("train") or {}
    merged = {**TRAIN_REQUEST_DEFAULTS, **(requests.get("default") or {}), **(requests.get(dataset) or {})}
    if search is not None:
        merged["runtime"] *= search_run_count(search)
    return merged


def search_run_count(search: Mapping[str, Any] | None) -> int:
    """The runs one job trains: a search's (its `search:` block) trials × folds, else 1."""
    return search["trials"] * len(search.get("folds") or [None]) if search is not None else 1


#: training jobs' priorities stay below the workflow's small jobs' (aggregate, report_section: 5) and
#: the digit trunk's pretraining (10), which must not wait for them (docs/workflow.md#scheduling)
TRAIN_PRIORITY_CEILING = 4.0


def train_priority(images: int) -> float:
    """A training job's scheduler priority, rising with the images it trains on at most
    (`dmlrepro.preflight.projection.planned_images`) below TRAIN_PRIORITY_CEILING: Snakemake starts the
    highest first, so on a few cores the longest runs start early instead of trailing the workflow."""
    return round(TRAIN_PRIORITY_CEILING * images / (images + 100_000), 4)


def slurm_signal(request: Mapping[str, Any], dataset: str) -> str:
    """sbatch's --signal for a training job's `request` (train_request): SIGTERM to every process of
    the job `warning` seconds (default: min(300, 15 s per minute of runtime)) before its time limit;
    the run checkpoints after its current step and exits, and the profile's retries resume it."""
    warning = request.get("warning", min(300, request["runtime"] * 15))
    if warning >= request["runtime"] * 60:
        raise ValueError(
            f"config resources.train ({dataset}): warning = {warning} s: expected less than "
            f"runtime = {request['runtime']} min"
        )
    return f"--signal=TERM@{warning}" if warning else ""
