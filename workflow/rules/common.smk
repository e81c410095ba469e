# The run table (experiments -> content-addressed runs) and the input functions; no logic here.
from pathlib import Path

from snakemake.utils import validate

from dmlrepro.runs import canonical, dataset_parameters, experiment_runs, resolve_runs
from dmlrepro.train.data import label_noise_path

validate(config, "../schemas/config.schema.yaml")

DATA = config["data_root"]
RESULTS = config["results"]
EXPERIMENTS = list(config["experiments"])
RUNS = resolve_runs(config)
DATASET_PARAMS = dataset_parameters(RUNS)  # one preparation per dataset name


def run_of(wildcards):
    return RUNS[wildcards.run]


def dataset_of(wildcards):
    return RUNS[wildcards.run].config["dataset"]


def run_inputs(wildcards):
    """The prepared dataset, and the seeded noisy labels when the run asks for label noise."""
    dataset = dataset_of(wildcards)
    inputs = {"manifest": f"{DATA}/{dataset['name']}/manifest.csv"}
    if dataset["label_noise"] is not None:
        inputs["label_noise"] = str(label_noise_path({**dataset, "root": DATA}))
    return inputs


def dataset_params(wildcards):
    return DATASET_PARAMS.get(wildcards.dataset, {})


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
