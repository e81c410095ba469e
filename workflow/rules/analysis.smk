rule aggregate:
    input:
        metrics=experiment_metrics,
        train_logs=experiment_logs,
    output:
        table=LAYOUT.experiment_table("{experiment}"),
        seeds=LAYOUT.experiment_seeds("{experiment}"),  # per-seed values (Claims)
    log:
        LAYOUT.log("aggregate", "{experiment}"),
    wildcard_constraints:
        experiment="[^/]+",  # seeds/<experiment>.csv is this rule's second output, not an experiment
    # as soon as an experiment's runs are done, between training jobs (docs/workflow.md#scheduling)
    priority: 5
    params:
        records=experiment_records,
        metrics=lambda wildcards: TABLE.experiment(wildcards.experiment)["metrics"],
        last_finite=experiment_last_finite,
        mlrc=experiment_mlrc,
    message:
        "Aggregating experiment {wildcards.experiment}"
    script:
        "../scripts/aggregate.py"


rule report_section:
    input:
        table=rules.aggregate.output.table,
        metrics=experiment_metrics,
        train_logs=experiment_logs,
        manifests=experiment_manifests,
        reported=lambda wildcards: reported_table(wildcards.experiment),
        searches=experiment_search_trials,
    output:
        section=directory(LAYOUT.report_section("{experiment}")),
    log:
        LAYOUT.log("report_section", "{experiment}"),
    priority: 5  # as rule aggregate's
    params:
        experiment=lambda wildcards: canonical(TABLE.experiment(wildcards.experiment)),
        runs=section_runs,
        searches=section_searches,
        methods=experiment_methods,
        reported_dir=REPORTED,
    message:
        "Drawing the report section of {wildcards.experiment}"
    script:
        "../scripts/report_section.py"


rule report:
    input:
        sections=expand(rules.report_section.output.section, experiment=EXPERIMENTS),
        template=f"{TEMPLATES}/index.html.j2",
        claims_template=f"{TEMPLATES}/claims.html.j2",
        # the Claims section: the catalogue and every experiment's per-seed values
        claims=[CLAIMS] if CLAIMS else [],
        seeds=(
            expand(rules.aggregate.output.seeds, experiment=EXPERIMENTS)
            if CLAIMS
            else []
        ),
    output:
        # the report's folder (index.html, figures/, claims.json): `snakemake --report report.zip`
        # carries it whole beside Snakemake's own pages (docs/workflow.md#snakemakes-report)
        folder=report(
            directory(LAYOUT.report_dir()),
            htmlindex="index.html",
            category="Report",
            caption="../report/report.rst",
        ),
        html=LAYOUT.report("index.html"),
        claims=LAYOUT.report("claims.json"),  # the Claims section's verdicts and checks (docs/report.md#claimsjson)
    log:
        LAYOUT.log("report"),
    params:
        experiments=EXPERIMENTS,  # the sections' order
        not_run=SELECTION.not_run(),  # the active experiments left out or built in part, and why
        title=config["title"],
        claims_scale=config["claims"]["scale"] if CLAIMS else None,
        reported_dir=REPORTED,
    message:
        "Rendering the HTML report"
    script:
        "../scripts/report.py"
