"""Plumbing for rule report: the sections (section.json, runs.json) -> index.html (with provenance)."""

import json
from pathlib import Path

from dmlrepro.report import provenance, render_report
from dmlrepro.report.provenance import collect_section_runs
from dmlrepro.steplog import log_to

with log_to(snakemake.log[0]):
    folders = dict(zip(snakemake.params.experiments, snakemake.input.sections, strict=True))
    runs, experiments = collect_section_runs(folders)
    # the template lies in <repository>/reports/templates: the repository whose commit is reported
    sections = [json.loads((Path(folder) / "section.json").read_text()) for folder in snakemake.input.sections]
    render_report(sections, snakemake.input.sections,
                  provenance(Path(snakemake.input.template).parents[2], runs, experiments),
                  snakemake.output.html, Path(snakemake.input.template).parent, title=snakemake.params.title)
