"""Search experiments (`search:` in the workflow config) -> searches: the run table's side of
dmlrepro.tuning. A search is a base run config searched over a space (docs/tuning.md); its id is
the base run's id with a hash of the search spec appended."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from dmlrepro.nested import canonical
from dmlrepro.runs import ExperimentError, Run, add_run, experiment_points
from dmlrepro.search_space import parse_space
from dmlrepro.tuning.final import final_runs


def search_runs(config: Mapping[str, Any], experiments: list[str] | None = None) -> dict[str, Run]:
    """The searches of the search experiments (`search:`; dmlrepro.tuning searches keys of a base run
    config): one per method × dataset × seed × sweep point, keyed by search id = the base run's id
    with a hash of the search spec appended (a changed spec is a new search, as a changed
    hyperparameter is a new run)."""
    runs: dict[str, Run] = {}
    for name, position, run in experiment_points(config, experiments):
        if config["experiments"][name].get("search") is not None:
            spec = method_search_spec(config["experiments"][name]["search"], run.method)
            try:
                params = parse_space(spec["space"])
            except ValueError as error:
                raise ExperimentError(f"experiments.{name}.search.space (method {run.method}): {error}") from error
            run.run_id = f"{run.run_id}-{hashlib.sha256(json.dumps(canonical(spec), sort_keys=True).encode()).hexdigest()[:6]}"
            add_run(runs, name, position, run)
            if config["experiments"][name].get("final"):  # a bad final stage fails now, not after the search
                probe = runs[run.run_id]
                followup = probe.config["followup"]  # a plateau-triggered followup: 0 = no cap; stand in 1 epoch
                final_runs(config, name, probe, {p.key: p.example() for p in params},
                           {"epochs": probe.config["epochs"], "followup_epochs": followup["epochs"]
                            or int(followup.get("trigger") == "plateau")})
    return runs


def method_search_spec(spec: Mapping[str, Any], method: str) -> dict:
    """The `search:` block one method's searches run: `space` with the method's own keys from
    `method_space.<method>` added (per-loss hyperparameters, RSW App. D), `method_space` dropped.
    A search id hashes this, so editing one method's space leaves the other methods' searches alone."""
    spec = dict(spec)
    own = (spec.pop("method_space", None) or {}).get(method) or {}
    return {**spec, "space": {**(spec.get("space") or {}), **own}}
