"""Hyperparameter search over the training engine (docs/tuning.md).

from dmlrepro.tuning import parse_space, run_search, load_trials, posterior_surface
"""

from dmlrepro.search_space import Param, parse_space

from .bayes import (
    SearchError,
    Surface,
    best_validation_value,
    load_trials,
    params_hash,
    posterior_surface,
    run_search,
)
from .final import COMPLETE_KEY, FinalStage, final_runs, observed_epochs

__all__ = [
    "COMPLETE_KEY",
    "FinalStage",
    "Param",
    "SearchError",
    "Surface",
    "best_validation_value",
    "final_runs",
    "load_trials",
    "observed_epochs",
    "params_hash",
    "parse_space",
    "posterior_surface",
    "run_search",
]
