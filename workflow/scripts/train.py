"""Plumbing for rule train: one run config -> dmlrepro.train.train_run into the run's folder."""

from pathlib import Path

from dmlrepro.steplog import log_to
from dmlrepro.runs import deep_merge, job_runtime
from dmlrepro.train import train_run

runtime = job_runtime(snakemake.params.data_root, snakemake.threads, snakemake.config.get("cache_images", False))
config = deep_merge(snakemake.params.config, runtime)
with log_to(snakemake.log[0]):
    train_run(config, Path(snakemake.output.metrics).parent, progress=False)
