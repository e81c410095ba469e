"""Plumbing for rule prepare_dataset: snakemake.wildcards/params and the dataset's entry of config `sources`
-> dmlrepro.data.prepare (in a fork of the job server when the workflow runs one: dmlrepro.jobserver)."""

from dmlrepro.data.registry import source_arguments
from dmlrepro.jobserver import run_job

dataset = snakemake.wildcards.dataset

run_job(
    "dmlrepro.data:prepare",
    dataset,
    snakemake.params.root,
    progress=False,
    log=snakemake.log[0],
    threads=snakemake.threads,
    **snakemake.params.options,
    **source_arguments(dataset, snakemake.config["sources"].get(dataset)),
)
