"""Plumbing for rule pretrain_standin: the recipe -> dmlrepro.models.standin.pretrain into the weights
file (in a fork of the job server when the workflow runs one: dmlrepro.jobserver)."""

from dmlrepro.jobserver import run_job

run_job(
    "dmlrepro.models.standin:pretrain",
    snakemake.params.recipe,
    snakemake.output.weights,
    log=snakemake.log[0],
    threads=snakemake.threads,
)
