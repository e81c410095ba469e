"""Plumbing for rule report_section: one experiment's table and runs -> dmlrepro.report.section_job
(section.json + figures, runs.json); in a fork of the job server when the workflow runs one."""

from dmlrepro.jobserver import run_job

run_job(
    "dmlrepro.report.section_job:write_section",
    snakemake.wildcards.experiment,
    snakemake.params.experiment,
    snakemake.input.table,
    snakemake.params.runs,
    snakemake.output.section,
    reported_dir=snakemake.params.reported_dir,
    method_configs=snakemake.params.methods,
    searches=snakemake.params.searches,
    metrics=list(snakemake.input.metrics),
    train_logs=list(snakemake.input.train_logs),
    log=snakemake.log[0],
    threads=snakemake.threads,
)
