"""Search experiments (`search:` in the workflow config) -> searches: the run table's side of
dmlrepro.tuning. A search is a base run config searched over a space (docs/tuning.md); its id is
the base run's id with a hash of the search spec appended."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from dmlrepro.nested import canonical
from dmlrepro.runs import (
    ExperimentError,
    Run,
    add_run,
    experiment_names,
    experiment_points,
    with_schema_defaults,
)
from dmlrepro.search_space import parse_space
from dmlrepro.tuning.final import final_runs


def search_runs(config: Mapping[str, Any], experiments: list[str] | None = None) -> dict[str, Run]:
    """The searches of the search experiments (`search:`; dmlrepro.tuning searches keys of a base run
    config) among the named ones (default: the active ones): one per method × dataset × seed × sweep
    point, keyed by search id = the base run's id with a hash of the search spec appended (a changed
    spec is a new search, as a changed hyperparameter is a new run)."""
    config = with_schema_defaults(config)
    names = [name for name in experiment_names(config, experiments) if "search" in config["experiments"][name]]
    runs: dict[str, Run] = {}
    for name, position, run in experiment_points(config, names):
        spec = method_search_spec(config["experiments"][name]["search"], run.method)
        try:
            parse_space(spec["space"])
        except ValueError as error:
            raise ExperimentError(f"experiments.{name}.search.space (method {run.method}): {error}") from error
        run.run_id = (
            f"{run.run_id}-{hashlib.sha256(json.dumps(canonical(spec), sort_keys=True).encode()).hexdigest()[:6]}"
        )
        add_run(runs, name, position, run)
        example_final_runs(config, name, runs[run.run_id])  # a bad final stage fails now, not after the search
    return runs


def method_search_spec(spec: Mapping[str, Any], method: str) -> dict:
    """The `search:` block one method's searches run: `space` with the method's own keys from
    `method_space.<method>` added (per-loss hyperparameters, RSW App. D), `method_space` dropped.
    A search id hashes this, so editing one method's space leaves the other methods' searches alone."""
    spec = dict(spec)
    own = (spec.pop("method_space", None) or {}).get(method) or {}
    return {**spec, "space": {**(spec.get("space") or {}), **own}}


def example_final_runs(config: Mapping[str, Any], experiment: str, search: Run) -> dict[str, Run]:
    """Stand-ins for the final stage of one search (`final:`, dmlrepro.tuning.final.final_runs; none
    without one): the runs it trains after the search, at the search space's example point (the best
    point is not known before the search) and, for the Complete runs, the base run's epochs (a
    plateau-triggered followup, uncapped, stands in as 1 epoch). Their shapes and counts are the final
    stage's, their ids not the ones the workflow will give them; building them checks the stage."""
    if not config["experiments"][experiment].get("final"):
        return {}
    spec = method_search_spec(config["experiments"][experiment]["search"], search.method)
    point = {param.key: param.example() for param in parse_space(spec["space"])}
    followup = search.config["followup"]
    epochs = {
        "epochs": search.config["epochs"],
        "followup_epochs": followup["epochs"] or int(followup.get("trigger") == "plateau"),
    }
    return final_runs(config, experiment, search, point, epochs)
