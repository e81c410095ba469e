"""One report section per experiment: its kind (config `experiments.<name>.report.kind`, the
registry report.kinds) decides what is drawn. Every section is plain data (`section.json`) plus its
figures, in one folder."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dmlrepro.atomic import write_json_atomic

from .compare import comparison_table
from .kinds import SectionInputs, section_kind
from .reported import load_reported
from .section_data import add_untrained_rows, blocks_as_metrics

SECTION_FILE = "section.json"


def build_section(
    name: str,
    experiment: Mapping[str, Any],
    aggregated: pd.DataFrame,
    runs: Sequence[Mapping],
    outdir: str | os.PathLike,
    *,
    reported_dir: str | os.PathLike,
    method_configs: Mapping,
    searches: Sequence[Mapping] = (),
) -> dict:
    """Write `outdir/section.json` (and its figures) for experiment `name`; return the section.

    `runs`: the experiment's runs in declared order, each with `run_id`, `method`, `dataset`, `seed`,
    `config` (resolved) and `dir` (the run folder). `method_configs`: config.methods, for the toy.
    `searches`: an experiment with `search:` has searches instead of runs (`run_id`, `method`,
    `dataset`, `seed`, `dir` = the search folder of dmlrepro.tuning)."""
    spec = experiment.get("report") or {}
    kind = check_report(name, experiment)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    section = {
        "experiment": name,
        "kind": spec.get("kind", "table"),
        "title": spec.get("title", name),
        "description": experiment.get("description", ""),
        "paper_says": spec.get("paper_says", ""),
        "reported": spec.get("reported"),
        "block": spec.get("block"),
        "headline": spec.get("headline"),
        "table": None,
        "figures": [],
        "notes": list(spec.get("notes", [])),
        "readings": list(spec.get("readings", [])),
        "ratios": [],
        "hparams": [],
        "runs": [r["run_id"] for r in runs],
    }
    inputs = SectionInputs(
        name,
        experiment,
        aggregated,
        runs,
        searches,
        reported_table(spec, reported_dir),
        method_configs,
        outdir,
        section,
    )
    if kind.table:
        section["table"] = comparison_table(
            aggregated,
            inputs.reported,
            inputs.metrics,
            inputs.methods,
            inputs.datasets,
            inputs.seeds,
            spec.get("uncertainty", "ci95" if spec.get("mlrc") else "std"),
        )
        add_untrained_rows(section["table"], aggregated, inputs.methods)  # how much training added
    kind.build(inputs)
    write_json_atomic(outdir / SECTION_FILE, section)
    return section


def check_report(name: str, experiment: Mapping[str, Any]):
    """The kind of experiment `name`'s report section, its spec checked (a ValueError names the key):
    the workflow calls this at parse time, so a bad report fails before any job."""
    spec = experiment.get("report") or {}
    kind = section_kind(name, spec.get("kind", "table"))
    methods = experiment.get("methods", [])
    if "headline" in spec and spec["headline"] not in methods:
        raise ValueError(f"experiment {name!r}: report.headline {spec['headline']!r} not among its methods {methods}")
    if kind.check is not None:
        kind.check(name, experiment)
    return kind


def reported_table(spec: Mapping[str, Any], reported_dir: str | os.PathLike) -> pd.DataFrame | None:
    """The published rows a report compares with (`report.reported`, its `block`; `block_metrics`:
    printed blocks read as metrics of ours), None without `report.reported`."""
    if not spec.get("reported"):
        return None
    reported = load_reported(Path(reported_dir) / f"{spec['reported']}.csv", spec.get("block"))
    if spec.get("block_metrics"):
        reported = blocks_as_metrics(reported, spec["block_metrics"], list((spec.get("datasets") or {}).values()))
    return reported
