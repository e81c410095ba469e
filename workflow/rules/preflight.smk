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
