rule train:
    input:
        unpack(run_inputs),
    output:
        metrics=f"{RESULTS}/runs/{{run}}/metrics.json",
        train_log=f"{RESULTS}/runs/{{run}}/train_log.csv",
    log:
        f"{RESULTS}/logs/train/{{run}}.log",
    conda:
        "../../envs/dmlrepro-gpu.yaml"
    threads: 1
    resources:
        runtime=train_resource("runtime"),
        mem_mb=train_resource("mem_mb"),
        gpu=train_resource("gpu"),
        slurm_extra=train_resource("slurm_extra"),
    params:
        config=lambda wildcards: canonical(run_of(wildcards).config),
        data_root=DATA,
    message:
        "Training run {wildcards.run}"
    script:
        "../scripts/train.py"


rule search:
    input:
        unpack(run_inputs),
    output:
        trials=f"{RESULTS}/search/{{search}}/trials.csv",
        best=f"{RESULTS}/search/{{search}}/best.json",
    log:
        f"{RESULTS}/logs/search/{{search}}.log",
    conda:
        "../../envs/dmlrepro-gpu.yaml"
    threads: 1
    resources:
        runtime=train_resource("runtime"),
        mem_mb=train_resource("mem_mb"),
        gpu=train_resource("gpu"),
        slurm_extra=train_resource("slurm_extra"),
    params:
        config=lambda wildcards: canonical(search_of(wildcards).config),
        search=search_spec,
        data_root=DATA,
    message:
        "Searching {wildcards.search}"
    script:
        "../scripts/search.py"
