"""Plumbing for rule train: one run config -> dmlrepro.train.train_run into the run's folder."""

import os
from pathlib import Path

from dmlrepro.preflight.projection import job_budget_env
from dmlrepro.steplog import log_to
from dmlrepro.nested import deep_merge
from dmlrepro.runs import job_runtime
from dmlrepro.train import train_run

runtime = job_runtime(snakemake.params.data_root, snakemake.threads, snakemake.config.get("cache_images", False))
config = deep_merge(snakemake.params.config, runtime)
os.environ.update(job_budget_env(snakemake.resources.runtime))  # the engine's time-budget check (docs/preflight.md)
with log_to(snakemake.log[0]):
    train_run(config, Path(snakemake.output.metrics).parent, progress=False)
