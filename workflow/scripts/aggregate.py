"""Plumbing for rule aggregate: the experiment's metrics.json and train_log.csv files -> one table
(mean ± std per cell) and its per-seed values (the Claims section's input)."""

import json

from dmlrepro.report import aggregate_runs, timing_metrics, write_table
from dmlrepro.report.aggregate import mlrc_records, seed_table
from dmlrepro.steplog import log_to

with log_to(snakemake.log[0]):
    records = []
    for record, path, log in zip(snakemake.params.records, snakemake.input.metrics, snakemake.input.train_logs):
        with open(path) as handle:
            records.append({**record, "result": json.load(handle), "timing": timing_metrics(log)})
    if snakemake.params.mlrc:  # fold runs -> separated / concatenated records
        records = mlrc_records(records)
    write_table(aggregate_runs(records, snakemake.params.metrics, last_finite=snakemake.params.last_finite),
                snakemake.output.table)
    write_table(seed_table(records, snakemake.params.metrics, last_finite=snakemake.params.last_finite),
                snakemake.output.seeds)
