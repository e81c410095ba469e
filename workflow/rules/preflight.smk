# `snakemake --profile slurm preflight`: every run shape of the config built and stepped on a GPU node,
# and the projected hours (docs/preflight.md); no other target depends on it.
from dmlrepro.preflight.workflow import (
    PREFLIGHT_JSON,
    PREFLIGHT_TABLE,
    preflight_resources,
)

PREFLIGHT = preflight_resources(config, EXPERIMENTS)


rule preflight:
    output:
        json=LAYOUT.results_file(PREFLIGHT_JSON),
        table=LAYOUT.results_file(PREFLIGHT_TABLE),
    log:
        LAYOUT.log("preflight"),
    threads: PREFLIGHT["cpus"]
    resources:
        runtime=PREFLIGHT["runtime"],
        mem_mb=PREFLIGHT["mem_mb"],
        gpu=PREFLIGHT["gpu"],
    params:
        experiments=EXPERIMENTS,
        data_root=DATA,
    message:
        "Preflight: every run shape, on the largest of the training jobs' requests"
    script:
        "../scripts/preflight.py"
