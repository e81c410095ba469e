rule aggregate:
    input:
        metrics=experiment_metrics,
    output:
        table=f"{RESULTS}/experiments/{{experiment}}.csv",
    log:
        f"{RESULTS}/logs/aggregate/{{experiment}}.log",
    conda:
        "../../envs/dmlrepro-cpu.yaml"
    params:
        records=experiment_records,
        metrics=lambda wildcards: config["experiments"][wildcards.experiment]["metrics"],
    message:
        "Aggregating experiment {wildcards.experiment}"
    script:
        "../scripts/aggregate.py"
