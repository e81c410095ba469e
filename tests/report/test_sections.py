"""Which run a per-dataset figure (retrieval grid, t-SNE) or a per-method panel draws; the registry
of section kinds."""

from pathlib import Path

import pytest
import yaml

from dmlrepro.report.kinds import SECTION_KINDS, register_kind, section_kind
from dmlrepro.report.section_data import first_runs_per_dataset, first_runs_per_method
from dmlrepro.report.sections import build_section, check_report

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


def _run(method, dataset, seed, sweep=0):
    return {"run_id": f"{method}-{dataset}-s{seed}-{sweep}", "method": method, "dataset": dataset, "seed": seed}


def test_first_method_lowest_seed_per_dataset():
    # declared order: methods x datasets x sweep x seeds, seeds listed high to low
    runs = [_run(m, d, s, p) for m in ("pfml", "pa") for d in ("cub", "cars") for p in (0, 1) for s in (3, 0)]
    picked = first_runs_per_dataset(runs)
    assert [r["run_id"] for r in picked] == ["pfml-cub-s0-0", "pfml-cars-s0-0"]
    assert first_runs_per_dataset([]) == []


def test_lowest_seed_per_method_and_dataset():
    runs = [_run(m, "cub", s) for m in ("pfml", "pa") for s in (2, 1)]
    assert [r["run_id"] for r in first_runs_per_method(runs)] == ["pfml-cub-s1-0", "pa-cub-s1-0"]


def test_every_kind_the_workflow_schema_allows_has_a_builder_and_no_other():
    schema = yaml.safe_load(SCHEMA.read_text())
    allowed = schema["properties"]["experiments"]["additionalProperties"]["properties"]["report"]["properties"]["kind"]
    assert sorted(SECTION_KINDS) == sorted(allowed["enum"])


def test_an_unknown_kind_names_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"experiments\.fig\.report\.kind: 'bars' is not one of \('table', 'sweep'"):
        build_section(
            "fig", {"report": {"kind": "bars"}}, None, [], tmp_path / "s", reported_dir=".", method_configs={}
        )
    assert not (tmp_path / "s").exists()  # nothing drawn
    assert section_kind("fig", "sweep").table and not section_kind("fig", "landscape").table


def test_a_registered_kind_is_built_and_its_check_runs_first(tmp_path):
    seen = []

    def check(name, experiment):
        if experiment["report"].get("bad"):
            raise ValueError(f"experiments.{name}.report.bad")

    @register_kind("probe", check=check)
    def probe(inputs):
        seen.append(inputs.name)
        inputs.section["hparams"] = [{"from": "probe"}]

    try:
        with pytest.raises(ValueError, match="report.bad"):
            check_report("fig", {"report": {"kind": "probe", "bad": True}})
        section = build_section(
            "fig", {"report": {"kind": "probe"}}, None, [], tmp_path / "s", reported_dir=".", method_configs={}
        )
    finally:
        SECTION_KINDS.pop("probe")
    assert seen == ["fig"] and section["hparams"] == [{"from": "probe"}] and section["table"] is None
    assert (tmp_path / "s" / "section.json").is_file()
