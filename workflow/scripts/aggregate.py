"""Plumbing for rule aggregate: the experiment's metrics.json and train_log.csv files ->
dmlrepro.report.aggregate.write_experiment_tables (in a fork of the job server when the workflow
runs one: dmlrepro.jobserver)."""

from dmlrepro.jobserver import run_job

run_job(
    "dmlrepro.report.aggregate:write_experiment_tables",
    list(snakemake.params.records),
    list(snakemake.input.metrics),
    list(snakemake.input.train_logs),
    list(snakemake.params.metrics),
    mlrc=bool(snakemake.params.mlrc),
    last_finite=snakemake.params.last_finite,
    table=snakemake.output.table,
    seeds=snakemake.output.seeds,
    log=snakemake.log[0],
    threads=snakemake.threads,
)
