"""Plumbing for rule report: sections + runs' metrics and logs -> index.html (with provenance)."""

import json
from pathlib import Path

from dmlrepro.report import provenance, render_report, timing_metrics
from dmlrepro.steplog import log_to

with log_to(snakemake.log[0]):
    runs = []
    for run, metrics, log in zip(snakemake.params.runs, snakemake.input.metrics, snakemake.input.train_logs):
        status = json.loads(Path(metrics).read_text()).get("status")
        runs.append({**run, "status": status, "train_hours": timing_metrics(log).get("train_hours", 0.0)})
    # the template lies in <repository>/reports/templates: the repository whose commit is reported
    sections = [json.loads((Path(folder) / "section.json").read_text()) for folder in snakemake.input.sections]
    render_report(sections, snakemake.input.sections,
                  provenance(Path(snakemake.input.template).parents[2], runs, snakemake.params.experiments),
                  snakemake.output.html, Path(snakemake.input.template).parent, title=snakemake.params.title)
