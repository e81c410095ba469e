"""Plumbing for rule prepare_dataset: snakemake.wildcards/params -> dmlrepro.data.prepare (in a fork of
the job server when the workflow runs one: dmlrepro.jobserver)."""

from dmlrepro.jobserver import run_job

run_job(
    "dmlrepro.data:prepare",
    snakemake.wildcards.dataset,
    snakemake.params.root,
    progress=False,
    log=snakemake.log[0],
    threads=snakemake.threads,
    **snakemake.params.options,
)
