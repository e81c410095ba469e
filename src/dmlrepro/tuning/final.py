"""The final stage after a search (RSW App. D, the metric-learning reality check): the search's
best point trained again (:func:`final_runs`), how long the "Complete" runs train
(:func:`observed_epochs`), and the run table the workflow grows with them (:class:`FinalStage`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from dmlrepro.nested import deep_merge, undotted
from dmlrepro.runs import ExperimentError, Run, add_run, experiment_runs, run_id_for
from dmlrepro.train.config import resolve_run_config, without_late_defaults


def observed_epochs(train_logs: list[Any], multiple: int = 5) -> dict[str, Any]:
    """RSW App. D-B: a Complete run trains, per phase, "the mean of the total and followup epochs
    observed in the eval runs, rounded up to the nearest multiple of 5". Observed = the epochs each
    fold run's train_log.csv holds (epoch ≥ 1; followup = phase 2), so early stopping counts."""
    import pandas as pd  # deferred: pandas; the Snakefile imports this module

    totals, followups = [], []
    for path in train_logs:
        log = pd.read_csv(path)
        log = log[log["epoch"] >= 1]
        totals.append(len(log))
        followups.append(int((log["phase"] == 2).sum()) if "phase" in log else 0)
    if not totals:
        raise ValueError("observed_epochs: no train logs")

    def up(values):
        return max(multiple, multiple * math.ceil(sum(values) / len(values) / multiple))

    followup = up(followups) if any(followups) else 0
    return {
        "epochs": max(up(totals), followup + multiple),
        "followup_epochs": followup,
        "observed": {"epochs": totals, "followup_epochs": followups},
    }


#: the sweep key that marks a "Complete" run of an experiment's `final:` stage (RSW App. D-B)
COMPLETE_KEY = "complete"


def final_runs(
    config: Mapping[str, Any],
    experiment: str,
    search: Run,
    best_params: Mapping[str, Any],
    complete_epochs: Mapping[str, int] | None = None,
) -> dict[str, Run]:
    """The final stage of a search experiment (`final:`; RSW App. D, the metric-learning reality
    check): the search's best point trained again, on its base run config, as

    * fold runs: every `final.seeds` seed × every `search.folds` fold (or one run per seed when the
      search has no folds), sweep point {<search's point>, validation.fold: k}: the MLRC blocks
      "Aggregate (128-dim)" and "Ensemble (512-dim)";
    * with `final.complete` (run-config overrides, e.g. embedding 512, no validation split) and
      `complete_epochs` ({epochs, followup_epochs} from :func:`observed_epochs`), one "Complete"
      run per seed, sweep point {<search's point>, complete: True}. Its followup phase is the last
      `followup_epochs` epochs (``followup.trigger: epochs``) also when the fold runs switched on a
      validation plateau (``trigger: plateau``): a Complete run has no validation split. When no fold
      run reached phase 2 (0 observed epochs, e.g. all stopped early), it has none, nor ``followup.loss``.

    Each is an ordinary content-addressed run (its id hashes its resolved config). `config` has the
    schema's defaults (dmlrepro.runs.with_schema_defaults)."""
    exp = config["experiments"][experiment]
    spec, folds = exp["final"], exp["search"]["folds"]
    point = search.experiments[experiment]
    tuned = deep_merge(search.config, undotted(best_params))
    variants = (
        [({**point, "validation.fold": fold}, {"validation": {"fold": fold}}) for fold in folds]
        if folds
        else [(dict(point), {})]
    )
    if spec.get("complete") is not None and complete_epochs is not None:
        variants.append(({**point, COMPLETE_KEY: True}, _complete_override(spec["complete"], tuned, complete_epochs)))
    runs: dict[str, Run] = {}
    position = 0
    for seed in spec["seeds"]:
        for sweep, override in variants:
            partial = deep_merge(deep_merge(tuned, override), {"seed": seed})
            if sweep.get(COMPLETE_KEY) and not partial.get("followup", {}).get("epochs", 0):
                partial.setdefault("followup", {})["loss"] = {}  # no fold run reached phase 2: none here either
            try:
                resolved = without_late_defaults(resolve_run_config(partial))
            except ValueError as error:
                raise ExperimentError(
                    f"experiments.{experiment}.final (method {search.method}, dataset "
                    f"{search.dataset}, seed {seed}, {sweep}): {error}"
                ) from error
            run = Run(
                run_id_for(search.method, search.dataset, resolved),
                search.method,
                search.dataset,
                seed,
                resolved,
                {experiment: sweep},
            )
            add_run(runs, experiment, search.position[experiment] * 10_000 + position, run)
            position += 1
    return runs


def _complete_override(
    complete: Mapping[str, Any], tuned: Mapping[str, Any], complete_epochs: Mapping[str, int]
) -> dict[str, Any]:
    """The Complete run's overrides: `final.complete` with the fold runs' observed epochs; a followup
    phase switched on a validation plateau becomes fixed epochs (RSW App. D-B: no validation split)."""
    plateau = (tuned.get("followup") or {}).get("trigger") == "plateau"
    epochs: dict[str, Any] = {"epochs": complete_epochs["epochs"]}
    if tuned.get("followup", {}).get("epochs") or plateau:
        epochs["followup"] = {"epochs": complete_epochs["followup_epochs"]}
    if plateau:
        epochs["followup"]["trigger"] = "epochs"
    return deep_merge(complete, epochs)


#: (search) -> the content of its best.json / its final stage's epochs.json, or None while unknown
Lookup = Callable[[Run], "Mapping[str, Any] | None"]


class FinalStage:
    """The run table of a workflow whose search experiments have a final stage: the final runs
    exist only once their search's best point (and the fold runs' epochs) are known, so the
    workflow adds them to `runs` while it plans (rule train then finds them there)."""

    def __init__(self, config: Mapping[str, Any], runs: dict[str, Run], searches: Mapping[str, Run]):
        self.config, self.runs, self.searches = config, runs, searches

    def register(self, runs: Mapping[str, Run]) -> dict[str, Run]:
        """Put `runs` into the table (a run another experiment also has keeps both experiments)."""
        for run_id, run in runs.items():
            known = self.runs.setdefault(run_id, run)
            known.experiments.update(run.experiments)
            known.position.update(run.position)
        return dict(runs)

    def experiment_runs(self, experiment: str, best: Lookup, epochs: Lookup) -> dict[str, Run]:
        """The final runs of `experiment` (none without `final:`), registered: for each of its
        searches whose `best` point is known, the fold runs, and the Complete runs once the fold
        runs' `epochs` are known (`epochs` is asked only when the stage has Complete runs)."""
        spec = self.config["experiments"][experiment]
        if not spec.get("final"):
            return {}
        runs: dict[str, Run] = {}
        for search in experiment_runs(self.searches, experiment):
            point = best(search)
            if point is None:
                continue
            observed = epochs(search) if spec["final"].get("complete") is not None else None
            runs.update(final_runs(self.config, experiment, search, point["params"], observed))
        return self.register(runs)

    def fold_runs(self, experiment: str, search_id: str, best: Mapping[str, Any]) -> dict[str, Run]:
        """The fold runs of one search's final stage (no Complete runs: their epochs come from these),
        registered."""
        return self.register(final_runs(self.config, experiment, self.searches[search_id], best["params"]))
