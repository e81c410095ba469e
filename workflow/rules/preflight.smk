# `snakemake --profile slurm preflight`: every run shape of the config built and stepped on a GPU node,
# and the projected hours (docs/preflight.md); no other target depends on it.
import os

from dmlrepro.preflight.workflow import (
    PREFLIGHT_JSON,
    PREFLIGHT_TABLE,
    RETRIES_ENV,
    preflight_resources,
)

PREFLIGHT = preflight_resources(config, EXPERIMENTS)


# the profile's retries, for each job's time budget (known once execution starts; the jobs, whose own
# Snakemake runs with --retries 0, inherit the environment); a job's time limit: workflow/scripts/train.py
onstart:
    os.environ.setdefault(RETRIES_ENV, str(workflow.execution_settings.retries))


rule preflight:
    output:
        json=f"{RESULTS}/{PREFLIGHT_JSON}",
        table=f"{RESULTS}/{PREFLIGHT_TABLE}",
    log:
        f"{RESULTS}/logs/preflight.log",
    conda:
        "../../envs/dmlrepro-gpu.yaml"
    threads: PREFLIGHT["cpus"]
    resources:
        runtime=PREFLIGHT["runtime"],
        mem_mb=PREFLIGHT["mem_mb"],
        gpu=PREFLIGHT["gpu"],
    params:
        experiments=EXPERIMENTS,
        data_root=DATA,
    message:
        "Preflight: every run shape on the {PREFLIGHT[dataset]} training job's resources"
    script:
        "../scripts/preflight.py"
