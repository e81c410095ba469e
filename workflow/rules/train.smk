rule train:
    input:
        unpack(run_inputs),
    output:
        metrics=f"{RESULTS}/runs/{{run}}/metrics.json",
    log:
        f"{RESULTS}/logs/train/{{run}}.log",
    conda:
        "../../envs/dmlrepro-gpu.yaml"
    threads: 1
    params:
        config=lambda wildcards: canonical(run_of(wildcards).config),
        data_root=DATA,
    message:
        "Training run {wildcards.run}"
    script:
        "../scripts/train.py"
