"""Training engine: run config -> trained model, test embeddings and metrics; resumable.

    from dmlrepro.train import resolve_run_config, train_run, evaluate_run
    train_run({"dataset": {"name": "digits"}, "loss": {"name": "pfml"}}, "results/run1")

See docs/training.md for every config key, the resume/signal protocol and the divergence record.
"""

from .checkpoint import CheckpointError, list_checkpoints, load_latest, read_checkpoint, save_checkpoint
from .config import DEFAULTS, GROUPS, ConfigError, load_run_config, resolve_run_config
from .engine import resolve_device, train_run
from .evaluate import EMBEDDINGS_FILE, compute_embeddings, evaluate_run
from .preemption import EXIT_INTERRUPTED, RunInterrupted

__all__ = [
    "DEFAULTS",
    "GROUPS",
    "EMBEDDINGS_FILE",
    "EXIT_INTERRUPTED",
    "CheckpointError",
    "ConfigError",
    "RunInterrupted",
    "compute_embeddings",
    "evaluate_run",
    "list_checkpoints",
    "load_latest",
    "load_run_config",
    "read_checkpoint",
    "resolve_device",
    "resolve_run_config",
    "save_checkpoint",
    "train_run",
]
