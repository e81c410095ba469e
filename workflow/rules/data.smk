rule prepare_dataset:
    output:
        manifest=f"{DATA}/{{dataset}}/manifest.csv",
    log:
        f"{RESULTS}/logs/prepare_dataset/{{dataset}}.log",
    conda:
        "../../envs/dmlrepro-cpu.yaml"
    params:
        root=lambda wildcards, output: Path(output.manifest).parent.parent,
        options=dataset_params,
    message:
        "Preparing dataset {wildcards.dataset}"
    script:
        "../scripts/prepare_dataset.py"
