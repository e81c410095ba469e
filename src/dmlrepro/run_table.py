"""The workflow's run table and results layout: what workflow/rules/common.smk asks (docs/workflow.md).

:class:`RunTable` builds, from one workflow config, every entry a job trains: the runs of the
experiments (dmlrepro.runs), the searches of the search experiments (dmlrepro.tuning.searches) and,
once a search's best point is known, its final stage's runs (dmlrepro.tuning.final). The config's
defaults are the schema's (workflow/schemas/config.schema.yaml), filled in once here.
:class:`ResultsLayout` says where each output lives; the rules spell no path of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmlrepro.data.manifest import MANIFEST_NAME
from dmlrepro.nested import canonical
from dmlrepro.runs import (
    ExperimentError,
    Run,
    dataset_parameters,
    experiment_names,
    experiment_runs,
    resolve_runs,
    with_schema_defaults,
)
from dmlrepro.tuning.final import FinalStage, Lookup
from dmlrepro.tuning.searches import example_final_runs, method_search_spec, search_runs


@dataclass(frozen=True)
class ResultsLayout:
    """Where the workflow's files live under the config's `results` and `data_root`. Each method gives
    one file; given wildcards (``"{run}"``) it gives the rule's pattern."""

    results: str
    data: str

    def run_dir(self, run_id: str) -> str:
        """A run's folder (dmlrepro.train.state.RunDir names its files)."""
        return f"{self.results}/runs/{run_id}"

    def run_file(self, run_id: str, name: str) -> str:
        return f"{self.run_dir(run_id)}/{name}"

    def search_dir(self, search_id: str) -> str:
        """A search's folder (trials.csv, best.json: dmlrepro.tuning.bayes)."""
        return f"{self.results}/search/{search_id}"

    def search_file(self, search_id: str, name: str) -> str:
        return f"{self.search_dir(search_id)}/{name}"

    def final_epochs(self, experiment: str, search_id: str) -> str:
        """How long a final stage's Complete runs train (rule final_epochs)."""
        return f"{self.results}/final/{experiment}/{search_id}/epochs.json"

    def failure(self, run_id: str) -> str:
        """The record of a run's or search's failed last attempt (dmlrepro.run_failures)."""
        return f"{self.results}/failed/{run_id}.json"

    def experiment_table(self, experiment: str) -> str:
        return f"{self.results}/experiments/{experiment}.csv"

    def experiment_seeds(self, experiment: str) -> str:
        """The per-seed values of an experiment's table (the report's Claims)."""
        return f"{self.results}/experiments/seeds/{experiment}.csv"

    def report_section(self, experiment: str) -> str:
        """An experiment's section (section.json, runs.json, figures), outside the report's folder."""
        return f"{self.results}/sections/{experiment}"

    def report_dir(self) -> str:
        """The rendered report's folder: index.html, figures/, claims.json, and nothing else (rule
        report owns it: Snakemake's report carries it whole)."""
        return f"{self.results}/report"

    def report(self, name: str) -> str:
        """A file of the rendered report (index.html, claims.json)."""
        return f"{self.report_dir()}/{name}"

    def target_report(self, target: str, name: str | None = None) -> str:
        """The report of one workflow target (a paper or an experiment: rule target_report), or its file `name`."""
        folder = f"{self.results}/targets/{target}"
        return f"{folder}/{name}" if name else folder

    def trunk_dir(self) -> str:
        """The digit trunk's weights (dmlrepro.digit_trunk_recipe). The folder keeps the name of the ImageNet
        stand-in it holds, `standin`: the runs' model.weights_cache_dir, so existing results stay complete."""
        return f"{self.results}/standin"

    def results_file(self, name: str) -> str:
        """A file of the results folder named by its module (the preflight's)."""
        return f"{self.results}/{name}"

    def log(self, rule: str, name: str | None = None) -> str:
        """A job's log: logs/<rule>/<name>.log, or logs/<rule>.log for a rule with one job."""
        return f"{self.results}/logs/{rule}/{name}.log" if name else f"{self.results}/logs/{rule}.log"

    def manifest(self, dataset: str) -> str:
        """A prepared dataset's manifest (rule prepare_dataset)."""
        return f"{self.data}/{dataset}/{MANIFEST_NAME}"


class RunTable:
    """Every run, search and final-stage run of a workflow config's experiments (default: the
    active ones). The final runs exist only once their search's best point (and the fold runs'
    epochs) are known: :meth:`final_runs` adds them to ``runs`` while the workflow plans."""

    def __init__(self, config: Mapping[str, Any], experiments: list[str] | None = None):
        self.config = with_schema_defaults(config)
        self.experiments = experiment_names(self.config, experiments)
        self.runs = resolve_runs(self.config, self.experiments)
        self.searches = search_runs(self.config, self.experiments)
        # one prepared copy per dataset name: a name used with two dataset.params fails here
        self.dataset_params = dataset_parameters({**self.runs, **self.searches})
        self._final = FinalStage(self.config, self.runs, self.searches)

    def trained(self, run_id: str) -> Run:
        """The run a train job trains, or the base run of a search job."""
        return self.searches[run_id] if run_id in self.searches else self.runs[run_id]

    def all_trained(self) -> dict[str, Run]:
        """The runs and searches known now (the final runs join once planned)."""
        return {**self.runs, **self.searches}

    def search_spec(self, search_id: str) -> dict[str, Any]:
        """The `search:` block a search runs: its (first) experiment's, with the method's own space
        (equal in every experiment by the search id's hash)."""
        search = self.searches[search_id]
        spec = self.config["experiments"][next(iter(search.experiments))]["search"]
        return canonical(method_search_spec(spec, search.method))

    def experiment(self, name: str) -> dict[str, Any]:
        """An experiment's block, the schema's defaults filled in."""
        return self.config["experiments"][name]

    def experiment_runs(self, experiment: str) -> list[Run]:
        """The runs of an experiment's table in its declared order (a final stage's once planned)."""
        return experiment_runs(self.runs, experiment)

    def experiment_searches(self, experiment: str) -> list[Run]:
        return experiment_runs(self.searches, experiment)

    def final_runs(self, experiment: str, best: Lookup, epochs: Lookup) -> dict[str, Run]:
        """The final runs of `experiment` (none without `final:`), added to the table: for each of its
        searches whose `best` point is known the fold runs, and the Complete runs once their `epochs`
        are (dmlrepro.tuning.final.FinalStage)."""
        return self._final.experiment_runs(experiment, best, epochs)

    def fold_runs(self, experiment: str, search_id: str, best: Mapping[str, Any]) -> dict[str, Run]:
        """The fold runs of one search's final stage, added to the table."""
        return self._final.fold_runs(experiment, search_id, best)

    def example_final_runs(self, experiment: str) -> dict[str, Run]:
        """Stand-ins for the final stage of each of the experiment's searches, before any search has
        run (dmlrepro.tuning.searches.example_final_runs): what the preflight steps and counts."""
        runs: dict[str, Run] = {}
        for search in self.experiment_searches(experiment):
            for run_id, run in example_final_runs(self.config, experiment, search).items():
                runs.setdefault(run_id, run)
        return runs


def run_record(run: Run, **extra: Any) -> dict[str, Any]:
    """What a job's script needs to know of a run: id, method, dataset, seed, then `extra`."""
    return {"run_id": run.run_id, "method": run.method, "dataset": run.dataset, "seed": run.seed, **extra}


def reported_tables(experiment: Mapping[str, Any], name: str, folder: str) -> list[str]:
    """The published table (config/reported/<name>.csv in `folder`) the experiment `name`'s report
    section compares with: one path, or none without `report.reported`; ExperimentError (one line)
    when the file does not exist."""
    reported = experiment.get("report", {}).get("reported")
    if reported is None:
        return []
    if not Path(folder, f"{reported}.csv").is_file():
        known = sorted(path.stem for path in Path(folder).glob("*.csv"))
        raise ExperimentError(f"config experiments.{name}.report.reported = {reported!r}: expected one of {known}")
    return [f"{folder}/{reported}.csv"]
