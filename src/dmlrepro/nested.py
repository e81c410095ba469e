"""Nested-dict helpers for run configs (mappings of mappings): merge, dotted keys, a canonical
key order. A leaf module: it imports nothing of dmlrepro."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """A copy of `base` with `override` merged in (mappings recursively, everything else replaced)."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def dotted(path: str, value: Any) -> dict:
    """ "loss.hparams.alpha", 4 -> {"loss": {"hparams": {"alpha": 4}}}."""
    for key in reversed(path.split(".")):
        value = {key: value}
    return value


def dotted_get(config: Mapping, path: str) -> Any:
    """The value at "loss.hparams.alpha" in a nested config (None where a level is missing)."""
    for key in path.split("."):
        if not isinstance(config, Mapping) or key not in config:
            return None
        config = config[key]
    return config


def canonical(value: Any) -> Any:
    """`value` with every mapping's keys sorted, so that equal configs also print equal (Snakemake
    compares rule params by their text: key order must not trigger a rerun)."""
    if isinstance(value, Mapping):
        return {key: canonical(value[key]) for key in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [canonical(item) for item in value]
    return value


def undotted(params: Mapping[str, Any]) -> dict:
    """{"asap.lam": 1e-3, "asap.b": 4} -> {"asap": {"lam": 1e-3, "b": 4}}."""
    out: dict = {}
    for key, value in params.items():
        out = deep_merge(out, dotted(key, value))
    return out
