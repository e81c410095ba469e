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


rule label_noise:
    input:
        manifest=rules.prepare_dataset.output.manifest,
    output:
        labels=f"{DATA}/{{dataset}}/label_noise/rate{{rate}}_seed{{seed}}_{{mode}}.csv",
    log:
        f"{RESULTS}/logs/label_noise/{{dataset}}_rate{{rate}}_seed{{seed}}_{{mode}}.log",
    conda:
        "../../envs/dmlrepro-cpu.yaml"
    message:
        "Corrupting {wildcards.rate} of the {wildcards.dataset} training labels (seed {wildcards.seed})"
    script:
        "../scripts/label_noise.py"
