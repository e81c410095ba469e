"""Hyperparameter search over the training engine (docs/tuning.md).

    from dmlrepro.tuning import parse_space, run_search, load_trials, posterior_surface
"""

from .bayes import (
    Param,
    SearchError,
    Surface,
    best_validation_value,
    load_trials,
    parse_space,
    params_hash,
    posterior_surface,
    run_search,
)
from .final import observed_epochs

__all__ = [
    "Param",
    "SearchError",
    "Surface",
    "best_validation_value",
    "load_trials",
    "observed_epochs",
    "params_hash",
    "parse_space",
    "posterior_surface",
    "run_search",
]
