"""Plumbing for rule report_section: one experiment's table and runs -> section.json + figures, and
runs.json (the experiment's runs for the report's provenance table)."""

from pathlib import Path

import pandas as pd

from dmlrepro.atomic import write_json_atomic
from dmlrepro.report import build_section
from dmlrepro.report.provenance import SECTION_RUNS, section_runs
from dmlrepro.steplog import log_to

with log_to(snakemake.log[0]):
    build_section(snakemake.wildcards.experiment, snakemake.params.experiment, pd.read_csv(snakemake.input.table),
                  snakemake.params.runs, snakemake.output.section, reported_dir=snakemake.params.reported_dir,
                  method_configs=snakemake.params.methods, searches=snakemake.params.searches)
    write_json_atomic(Path(snakemake.output.section) / SECTION_RUNS,
                      section_runs(snakemake.params.runs, snakemake.input.metrics, snakemake.input.train_logs))
