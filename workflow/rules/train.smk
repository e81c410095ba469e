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
