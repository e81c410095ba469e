"""Plumbing for rule preflight: the workflow config -> dmlrepro.preflight (JSON and table)."""

from dmlrepro import gpu_slots
from dmlrepro.preflight.workflow import run_rule
from dmlrepro.steplog import log_to

# a GPU of its own on a workstation (docs/workflow.md#one-node-several-gpus)
with gpu_slots.lease(snakemake.resources.gpu), log_to(snakemake.log[0]), gpu_slots.announced():
    run_rule(
        snakemake.config,
        snakemake.params.experiments,
        snakemake.params.data_root,
        snakemake.output.json,
        snakemake.output.table,
    )
