# Targets a researcher asks for (docs/workflow.md#targets): `snakemake pfml`, `snakemake rsw_table2`:
# a paper's or an experiment's runs and their own report, results/targets/<target>/index.html, which
# lists the target's experiments not run and why (dmlrepro.selection).
from dmlrepro.selection import target_scopes

TARGETS = target_scopes(
    SELECTION.active, reserved=[rule.name for rule in workflow.rules]
)


use rule report as target_report with:
    input:
        sections=target_files(rules.report_section.output.section),
        template=f"{TEMPLATES}/index.html.j2",
        claims_template=f"{TEMPLATES}/claims.html.j2",
        claims=[CLAIMS] if CLAIMS else [],
        seeds=target_files(rules.aggregate.output.seeds) if CLAIMS else [],
    output:
        folder=directory(LAYOUT.target_report("{target}")),
        html=LAYOUT.target_report("{target}", "index.html"),
        claims=LAYOUT.target_report("{target}", "claims.json"),
    log:
        LAYOUT.log("report", "{target}"),
    wildcard_constraints:
        target="|".join(TARGETS),
    params:
        experiments=target_experiments,
        not_run=lambda wildcards: SELECTION.not_run(TARGETS[wildcards.target]),
        title=lambda wildcards: f"{config['title']}: {wildcards.target}",
        claims_scale=config["claims"]["scale"] if CLAIMS else None,
        reported_dir=REPORTED,
    message:
        "Rendering the report of target {wildcards.target}"


for target in TARGETS:

    rule:
        name:
            target
        input:
            LAYOUT.target_report(target, "index.html"),
            runs=lambda wildcards, target=target: experiments_run_metrics(
                built_experiments(target)
            ),
        localrule: True
