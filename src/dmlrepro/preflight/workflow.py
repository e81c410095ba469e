"""The preflight as a workflow target (rule preflight, workflow/rules/preflight.smk): where it
writes, what its job asks the scheduler for, and the rule's step."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dmlrepro.budget import RETRIES_ENV
from dmlrepro.job_requests import train_request

#: under the config's `results` folder
PREFLIGHT_JSON = "preflight/preflight.json"
PREFLIGHT_TABLE = "preflight/preflight.txt"

__all__ = [
    "PREFLIGHT_JSON",
    "PREFLIGHT_TABLE",
    "RETRIES_ENV",
    "preflight_resources",
    "put_on_pythonpath",
    "run_rule",
    "trained_datasets",
]


def put_on_pythonpath(folder: str) -> None:
    """``folder`` first on this process's PYTHONPATH (once), which every job it starts inherits: the
    Snakefile puts the checkout's src/ there, so that every job imports the checkout's dmlrepro, even where
    the environment installed another copy (docs/preflight.md#conda)."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])


def trained_datasets(config: Mapping[str, Any], experiments: Sequence[str]) -> list[str]:
    """The datasets (config keys) the experiments train on, in their order."""
    names = [name for experiment in experiments for name in config["experiments"][experiment].get("datasets") or []]
    if not names:
        raise ValueError("no experiment trains on a dataset: nothing to preflight")
    return list(dict.fromkeys(names))


def preflight_resources(config: Mapping[str, Any], experiments: Sequence[str]) -> dict[str, Any]:
    """The preflight job's requests: each the largest of the training jobs' on the datasets the
    experiments train on, so that every run shape it builds and steps fits (docs/preflight.md)."""
    requests = [train_request(config, dataset) for dataset in trained_datasets(config, experiments)]
    keys = dict.fromkeys(key for request in requests for key in request)
    return {key: max(request[key] for request in requests if key in request) for key in keys}


def run_rule(
    config: dict[str, Any], experiments: Sequence[str], data_root: str, json_path: str, table_path: str
) -> int:
    """Rule preflight's step: every shape on this job's device, the profile's retries from the
    environment (docs/preflight.md). Problems are in the table and the JSON; the job itself
    succeeds so that both stay (Snakemake removes a failed job's outputs)."""
    from .cli import preflight  # deferred: imports torch
    from .shapes import group_runs  # deferred: imports torch

    status = preflight(
        config,
        "the workflow config",
        shapes=group_runs(config, list(experiments)),
        retries=int(os.environ.get(RETRIES_ENV) or 0),
        data_root=data_root,
        json_path=json_path,
        table_path=table_path,
    )
    print(f"dmlrepro preflight: exit status {status} ({'problems listed above' if status else 'no problems'})")
    return status
