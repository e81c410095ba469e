"""Plumbing for rule pretrain_digit_trunk: the recipe -> dmlrepro.models.digit_trunk.pretrain into the
weights file (in a fork of the job server when the workflow runs one: dmlrepro.jobserver)."""

from dmlrepro.jobserver import run_job

run_job(
    "dmlrepro.models.digit_trunk:pretrain",
    snakemake.params.recipe,
    snakemake.output.weights,
    snakemake.params.data_root,
    log=snakemake.log[0],
    threads=snakemake.threads,
)
