from dmlrepro.data.multidigit import prepared_dependencies
from dmlrepro.data.registry import check_sources

# config `sources`: where a benchmark's files come from, read by the rule's script (not a param: a run id
# does not depend on it and a changed entry reruns nothing); a bad entry stops here, before any job
check_sources(config["sources"])


# double_mnist / triple_mnist are made from a prepared mnist unless their params give a `source`
rule prepare_dataset:
    input:
        lambda wildcards: [
            LAYOUT.manifest(name)
            for name in prepared_dependencies(
                wildcards.dataset, dataset_params(wildcards)
            )
        ],
    output:
        manifest=LAYOUT.manifest("{dataset}"),
    log:
        LAYOUT.log("prepare_dataset", "{dataset}"),
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
        labels=str(label_noise_file(DATA, "{dataset}", "{rate}", "{seed}", "{mode}")),
    log:
        LAYOUT.log("label_noise", "{dataset}_rate{rate}_seed{seed}_{mode}"),
    message:
        "Corrupting {wildcards.rate} of the {wildcards.dataset} training labels (seed {wildcards.seed})"
    script:
        "../scripts/label_noise.py"
