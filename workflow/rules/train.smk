rule train:
    input:
        unpack(run_inputs),
        trunk=lambda wildcards: trunk_weights(trained_run(wildcards).config),  # workflow/rules/pretrain.smk
    output:
        metrics=LAYOUT.run_file("{run}", RunDir.METRICS),
        train_log=LAYOUT.run_file("{run}", RunDir.TRAIN_LOG),
    log:
        LAYOUT.log("train", "{run}"),
    priority: train_job_priority  # the longest runs start first
    threads: train_resource("cpus")  # sbatch --cpus-per-task; the run's CPU budget
    resources:
        runtime=train_resource("runtime"),
        mem_mb=train_resource("mem_mb"),
        gpu=train_resource("gpu"),
        slurm_extra=train_resource("slurm_extra"),
    params:
        config=lambda wildcards: canonical(
            with_trunk_folder(wildcard_run(wildcards).config)
        ),
        data_root=DATA,
    message:
        "Training run {wildcards.run}"
    script:
        "../scripts/train.py"


# a checkpoint: an experiment's final stage (`final:`) trains the best point it writes
checkpoint search:
    input:
        unpack(run_inputs),
        trunk=lambda wildcards: trunk_weights(trained_run(wildcards).config),  # workflow/rules/pretrain.smk
    output:
        trials=LAYOUT.search_file("{search}", TRIALS_CSV),
        best=LAYOUT.search_file("{search}", BEST_JSON),
    log:
        LAYOUT.log("search", "{search}"),
    priority: train_job_priority  # the longest runs start first
    threads: train_resource("cpus")  # sbatch --cpus-per-task; the run's CPU budget
    resources:
        runtime=train_resource("runtime"),
        mem_mb=train_resource("mem_mb"),
        gpu=train_resource("gpu"),
        slurm_extra=train_resource("slurm_extra"),
    params:
        config=lambda wildcards: canonical(
            with_trunk_folder(wildcard_search(wildcards).config)
        ),
        search=search_spec,
        data_root=DATA,
    message:
        "Searching {wildcards.search}"
    script:
        "../scripts/search.py"


# how long the final stage's Complete runs train (RSW App. D-B): the fold runs' epochs, rounded up
checkpoint final_epochs:
    input:
        train_logs=final_fold_logs,
    output:
        epochs=LAYOUT.final_epochs("{experiment}", "{search}"),
    log:
        LAYOUT.log("final_epochs", "{experiment}/{search}"),
    params:
        multiple=lambda wildcards: TABLE.experiment(wildcards.experiment)["final"][
            "round_epochs"
        ],
    message:
        "Epochs of the Complete runs of {wildcards.experiment} ({wildcards.search})"
    script:
        "../scripts/final_epochs.py"


# a cluster job's own Snakemake: the final runs whose searches (and epochs) are on disk
for experiment in EXPERIMENTS:
    final_stage(experiment, wait=False)
