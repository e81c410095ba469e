# The run table (experiments -> content-addressed runs) and the input functions; no logic here.
from pathlib import Path

from snakemake.utils import validate

from dmlrepro.runs import canonical, dataset_parameters, experiment_runs, resolve_runs

validate(config, "../schemas/config.schema.yaml")

DATA = config["data_root"]
RESULTS = config["results"]
EXPERIMENTS = list(config["experiments"])
RUNS = resolve_runs(config)


def run_of(wildcards):
    return RUNS[wildcards.run]


def dataset_of(wildcards):
    return RUNS[wildcards.run].config["dataset"]


def run_manifest(wildcards):
    return f"{DATA}/{dataset_of(wildcards)['name']}/manifest.csv"


def dataset_params(wildcards):
    return DATASET_PARAMS.get(wildcards.dataset, {})


DATASET_PARAMS = dataset_parameters(RUNS)


def experiment_metrics(wildcards):
    return [
        f"{RESULTS}/runs/{run.run_id}/metrics.json"
        for run in experiment_runs(RUNS, wildcards.experiment)
    ]


def experiment_records(wildcards):
    return [
        {
            "run_id": run.run_id,
            "method": run.method,
            "dataset": run.dataset,
            "seed": run.seed,
            "sweep": run.experiments[wildcards.experiment],
        }
        for run in experiment_runs(RUNS, wildcards.experiment)
    ]
