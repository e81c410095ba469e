"""Plumbing for rule train: one run config -> dmlrepro.train.train_run into the run's folder (in a
fork of the job server when the workflow runs one: dmlrepro.jobserver)."""

import os
from pathlib import Path

from dmlrepro.jobserver import run_job
from dmlrepro.nested import deep_merge
from dmlrepro.preflight.projection import job_budget_env
from dmlrepro.run_failures import recorded_failure
from dmlrepro.run_table import ResultsLayout
from dmlrepro.runs import job_runtime

runtime = job_runtime(snakemake.params.data_root, snakemake.threads, snakemake.config["cache_images"])
config = deep_merge(snakemake.params.config, runtime)
os.environ.update(job_budget_env(snakemake.resources.runtime))  # the engine's time-budget check (docs/preflight.md)
# the job's GPU request: device auto then stops at once where no GPU is usable (docs/environment.md#gpu-driver)
os.environ["DMLREPRO_GPUS"] = str(snakemake.resources.gpu)
# a failed attempt is recorded for a report without it (config skip_failed_runs, docs/workflow.md#when-runs-fail)
failure = ResultsLayout(snakemake.config["results"], snakemake.params.data_root).failure(snakemake.wildcards.run)
with recorded_failure(failure, snakemake.log[0]):
    run_job(
        "dmlrepro.train:train_run",
        config,
        Path(snakemake.output.metrics).parent,
        progress=False,
        log=snakemake.log[0],
        threads=snakemake.threads,
        gpu=snakemake.resources.gpu,  # a GPU of its own on a workstation (docs/workflow.md#one-node-several-gpus)
    )
