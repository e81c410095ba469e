"""Training engine: run config -> trained model, test embeddings and metrics; resumable.

    from dmlrepro.train import resolve_run_config, train_run, evaluate_run
    train_run({"dataset": {"name": "digits"}, "loss": {"name": "pfml"}}, "results/run1")

See docs/training.md for every config key, the resume/signal protocol and the divergence record.
The names below load their module on first use (PEP 562): `dmlrepro.train.config` alone, which the
workflow's job scripts and the run table read, does not import torch.
"""

import importlib

_EXPORTS = {
    "CheckpointError": "checkpoint",
    "list_checkpoints": "checkpoint",
    "load_latest": "checkpoint",
    "read_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "DEFAULTS": "config",
    "GROUPS": "config",
    "ConfigError": "config",
    "load_run_config": "config",
    "resolve_run_config": "config",
    "resolve_device": "engine",
    "train_run": "engine",
    "EMBEDDINGS_FILE": "run_evaluation",
    "compute_embeddings": "run_evaluation",
    "evaluate_run": "run_evaluation",
    "EXIT_INTERRUPTED": "preemption",
    "RunInterrupted": "preemption",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
