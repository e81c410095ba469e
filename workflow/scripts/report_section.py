"""Plumbing for rule report_section: one experiment's table and runs -> section.json + figures."""

import pandas as pd

from dmlrepro.report import build_section
from dmlrepro.steplog import log_to

with log_to(snakemake.log[0]):
    build_section(snakemake.wildcards.experiment, snakemake.params.experiment, pd.read_csv(snakemake.input.table),
                  snakemake.params.runs, snakemake.output.section, reported_dir=snakemake.params.reported_dir,
                  method_configs=snakemake.params.methods, searches=snakemake.params.searches)
