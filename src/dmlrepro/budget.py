"""A training job's time budget, checked inside the job: after the run's first full epoch, a run
whose ``epochs`` cannot finish within the job's time limit × (retries + 1) says so at once
(docs/preflight.md). The workflow puts the limit and the retries in the job's environment; the
training loop calls :func:`warn_time_budget`, and the preflight (``dmlrepro.preflight``) writes the
environment. No torch and no other dmlrepro module here: both sides import it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

#: the environment of a training job that knows its time budget (set by the workflow, docs/preflight.md)
TIME_LIMIT_ENV = "DMLREPRO_TIME_LIMIT_MINUTES"
RETRIES_ENV = "DMLREPRO_RETRIES"


def warn_time_budget(
    cfg: Mapping[str, Any],
    epoch: int,
    epoch_seconds: float,
    say: Callable[[str], None],
    environ: Mapping[str, str] = os.environ,
) -> str | None:
    """After the run's first full-training epoch (the first after the warm-up), say at once when
    ``epochs`` such epochs (``epoch_seconds``: that epoch's wall time, evaluations included) cannot
    finish within the job's time limit × (retries + 1); returns the message (None: fits or unknown)."""
    if epoch != cfg["warmup_epochs"] + 1 or not environ.get(TIME_LIMIT_ENV):
        return None
    limit_minutes = float(environ[TIME_LIMIT_ENV])
    retries = int(environ.get(RETRIES_ENV) or 0)
    projected = cfg["epochs"] * epoch_seconds / 3600.0
    budget = limit_minutes * (retries + 1) / 60.0
    if projected <= budget:
        return None
    message = (
        f"warning: epoch {epoch} took {epoch_seconds:.0f} s: {cfg['epochs']} epochs project to "
        f"{projected:.2f} h, past the job's time limit {limit_minutes:g} min × (retries {retries} + 1) = "
        f"{budget:.2f} h; this run cannot finish: raise resources.train runtime or retries "
        f"(docs/preflight.md)"
    )
    say(message)
    return message
