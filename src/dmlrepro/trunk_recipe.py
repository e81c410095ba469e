"""A pretrained trunk's recipe, the one logic behind the ImageNet stand-in (``dmlrepro.standin_recipe``)
and the digit-pretrained trunk (``dmlrepro.digit_trunk_recipe``): defaults merged with a run's
``model.<key>`` and checked, a content hash, where the weights live, and which runs fine-tune from it
(the workflow's inputs and config).

Without torch: the Snakefile and the run-config resolution import it; ``dmlrepro.models.pretraining``
trains and loads the weights.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HASH_LENGTH = 12


@dataclass(frozen=True)
class TrunkRecipe:
    """``key``: the value of ``model.pretrained`` that names the trunk and the run-config key holding
    its recipe; ``title``: its name in messages; ``prefix``: the weights file's name,
    ``<prefix>-<hash>.pt``; ``integers``: integer keys and their minimum (``nullable`` ones may be
    None); ``nested``: mappings merged key by key; ``check``: the recipe's own further checks, raising
    ``error``."""

    key: str
    title: str
    prefix: str
    defaults: Mapping[str, Any]
    error: type[ValueError]
    integers: Mapping[str, int]
    nullable: frozenset[str] = frozenset()
    nested: tuple[str, ...] = ()
    check: Callable[[dict[str, Any]], None] | None = field(default=None, compare=False)

    def resolve(self, recipe: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The defaults with ``recipe`` merged in (``nested`` keys key by key); unknown keys or bad values raise."""
        out = copy.deepcopy(dict(self.defaults))
        for key, value in (recipe or {}).items():
            if key not in out:
                raise self.error(f"model.{self.key}: unknown key {key!r}; expected one of {sorted(out)}")
            if key in self.nested:
                bad = sorted(set(value or {}) - set(out[key]))
                if bad:
                    raise self.error(f"model.{self.key}.{key}: unknown key(s) {bad}; expected {sorted(out[key])}")
                out[key].update(value or {})
            else:
                out[key] = value
        if not isinstance(out["backbone_kwargs"], Mapping):
            raise self.error(f"model.{self.key}.backbone_kwargs = {out['backbone_kwargs']!r}: expected a mapping")
        out["backbone_kwargs"] = dict(out["backbone_kwargs"])
        for key, low in self.integers.items():
            value = out[key]
            if key in self.nullable and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise self.error(f"model.{self.key}.{key} = {value!r}: expected an integer >= {low}")
        if self.check is not None:
            self.check(out)
        return out

    def hash(self, recipe: Mapping[str, Any] | None = None) -> str:
        """The first ``HASH_LENGTH`` hex digits of the sha256 of the resolved recipe's canonical JSON."""
        text = json.dumps(self.resolve(recipe), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]

    def weights_file(self, folder: str | os.PathLike, recipe: Mapping[str, Any] | None = None) -> Path:
        """Where the weights of ``recipe`` live: ``<folder>/<prefix>-<hash>.pt``."""
        return self.weights_file_of_hash(folder, self.hash(recipe))

    def weights_file_of_hash(self, folder: str | os.PathLike, digest: str) -> Path:
        """The one spelling of the weights' path (``digest``: a recipe's hash, or a Snakemake wildcard:
        the pretraining rule's output)."""
        return Path(folder) / f"{self.prefix}-{digest}.pt"

    def of_config(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """The resolved recipe a run config fine-tunes from, None when it starts from another network."""
        model = config.get("model") or {}
        return self.resolve(model.get(self.key)) if model.get("pretrained") == self.key else None

    def workflow_recipes(self, runs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Recipe hash -> recipe of every run (objects with a resolved ``config``) that fine-tunes from the trunk."""
        recipes = (self.of_config(run.config) for run in runs.values())
        return {self.hash(r): r for r in recipes if r is not None}

    def run_weights(self, config: Mapping[str, Any], folder: str | os.PathLike) -> list[str]:
        """The weights file a run config starts from (``[]`` for the others): a job's input."""
        recipe = self.of_config(config)
        return [] if recipe is None else [str(self.weights_file(folder, recipe))]

    def with_folder(self, config: Mapping[str, Any], folder: str | os.PathLike) -> dict[str, Any]:
        """``config`` with ``model.weights_cache_dir = folder`` if it fine-tunes from the trunk (a location
        key, not part of the run id); other configs unchanged."""
        if self.of_config(config) is None:
            return dict(config)
        return {**config, "model": {**config["model"], "weights_cache_dir": str(folder)}}
