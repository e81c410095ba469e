"""Plumbing for rule preflight: the workflow config -> dmlrepro.preflight (JSON and table)."""

import os

from dmlrepro import gpu_slots
from dmlrepro.preflight.workflow import run_rule
from dmlrepro.steplog import log_to
from dmlrepro.train.runtime import resolve_device

# the job's GPU request: it stops at once where no GPU is usable, as a training job does
# (docs/environment.md#gpu-driver); the runs' own `device` (defaults) may say cpu
os.environ["DMLREPRO_GPUS"] = str(snakemake.resources.gpu)
# a GPU of its own on a workstation (docs/workflow.md#one-node-several-gpus)
with gpu_slots.lease(snakemake.resources.gpu), log_to(snakemake.log[0]), gpu_slots.announced():
    resolve_device(snakemake.config.get("defaults", {}).get("device", "auto"))
    run_rule(
        snakemake.config,
        snakemake.params.experiments,
        snakemake.params.data_root,
        snakemake.output.json,
        snakemake.output.table,
    )
