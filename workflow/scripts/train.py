"""Plumbing for rule train: one run config -> dmlrepro.train.train_run into the run's folder."""

from pathlib import Path

from dmlrepro.steplog import log_to
from dmlrepro.runs import deep_merge
from dmlrepro.train import train_run

# rule prepare_dataset made the data with these params (common.smk checks they agree), so the
# engine's prepare step only finds them; torch uses the job's threads
runtime = {"dataset": {"root": snakemake.params.data_root, "prepare": True,
                       "cache_images": snakemake.config.get("cache_images", False)}, "threads": snakemake.threads}
config = deep_merge(snakemake.params.config, runtime)
with log_to(snakemake.log[0]):
    train_run(config, Path(snakemake.output.metrics).parent, progress=False)
