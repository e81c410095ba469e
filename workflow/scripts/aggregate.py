"""Plumbing for rule aggregate: the experiment's metrics.json files -> one table."""

import json

from dmlrepro.steplog import log_to
from dmlrepro.report import aggregate_runs, write_table

with log_to(snakemake.log[0]):
    records = []
    for record, path in zip(snakemake.params.records, snakemake.input.metrics):
        with open(path) as handle:
            records.append({**record, "result": json.load(handle)})
    write_table(aggregate_runs(records, snakemake.params.metrics), snakemake.output.table)
