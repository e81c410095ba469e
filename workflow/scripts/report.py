"""Plumbing for rule report: the sections (section.json, runs.json) -> index.html (with provenance),
and the Claims section from the catalogue and the experiments' per-seed tables (config `claims`)."""

import json
from pathlib import Path

from dmlrepro.preflight.workflow import PREFLIGHT_JSON
from dmlrepro.report import provenance, render_report
from dmlrepro.report.claims import claims_section, load_catalogue, load_check_ranges, seed_tables, write_claims
from dmlrepro.report.provenance import collect_section_runs
from dmlrepro.steplog import log_to

with log_to(snakemake.log[0]):
    folders = dict(zip(snakemake.params.experiments, snakemake.input.sections, strict=True))
    runs, experiments = collect_section_runs(folders)
    # the template lies in <repository>/reports/templates: the repository whose commit is reported
    sections = [json.loads((Path(folder) / "section.json").read_text()) for folder in snakemake.input.sections]
    claims = None
    if snakemake.input.claims:
        claims = claims_section(
            load_catalogue(snakemake.input.claims[0]),
            snakemake.params.claims_scale,
            seed_tables(snakemake.params.experiments, snakemake.input.seeds),
            snakemake.params.reported_dir,
            load_check_ranges(snakemake.input.claims[0]),
        )
    write_claims(claims, snakemake.output.claims)  # the verdicts the HTML renders, as data
    render_report(
        sections,
        snakemake.input.sections,
        provenance(
            Path(snakemake.input.template).parents[2],
            runs,
            experiments,
            Path(snakemake.config["results"]) / PREFLIGHT_JSON,
        ),
        snakemake.output.html,
        Path(snakemake.input.template).parent,
        title=snakemake.params.title,
        claims=claims,
        not_run=snakemake.params.not_run,  # the experiments left out and why (dmlrepro.selection)
    )
