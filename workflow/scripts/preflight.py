"""Plumbing for rule preflight: the workflow config -> dmlrepro.preflight (JSON and table)."""

from dmlrepro.preflight.workflow import run_rule
from dmlrepro.steplog import log_to

with log_to(snakemake.log[0]):
    run_rule(
        snakemake.config,
        snakemake.params.experiments,
        snakemake.params.data_root,
        snakemake.output.json,
        snakemake.output.table,
    )
