"""The Snakemake workflow catalog's standardized usage: `.snakemake-workflow-catalog.yml` in the catalog's
format, and the layout the catalog requires beside it (docs/workflow.md#layout).

The format is the one the catalog documents (its README, "Standardized usage workflows": `usage` with
`mandatory-flags` {desc, flags}, `software-stack-deployment` {conda, singularity, singularity+conda}, at
least one of them true, and `report`) and reads (scripts/generate-catalog.py, class Repo: those keys of
`usage`, through yaml.SafeLoader). The catalog publishes no JSON schema: CATALOG_SCHEMA writes that
documentation down. Unknown keys are refused: the catalog would ignore a misspelt key silently."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CATALOG_FILE = ROOT / ".snakemake-workflow-catalog.yml"
DEPLOYMENT = ("conda", "singularity", "singularity+conda")

CATALOG_SCHEMA = {
    "type": "object",
    "required": ["usage"],
    "additionalProperties": False,
    "properties": {
        "usage": {
            "type": "object",
            "required": ["software-stack-deployment"],
            "additionalProperties": False,
            "properties": {
                "mandatory-flags": {
                    "type": ["object", "null"],
                    "additionalProperties": False,
                    "properties": {"desc": {"type": ["string", "null"]}, "flags": {"type": ["string", "null"]}},
                },
                "software-stack-deployment": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {method: {"type": "boolean"} for method in DEPLOYMENT},
                    # "at least one of conda, singularity, or singularity+conda"
                    "anyOf": [{"required": [method], "properties": {method: {"const": True}}} for method in DEPLOYMENT],
                },
                "report": {"type": "boolean"},
            },
        }
    },
}


def catalog_settings(path: Path = CATALOG_FILE) -> dict:
    return yaml.load(path.read_text(encoding="utf-8"), yaml.SafeLoader)


def rule_blocks(text: str) -> dict[str, str]:
    """rule or checkpoint name -> its text, up to the next top-level line."""
    blocks = re.findall(r"^(?:rule|checkpoint) (\w+):\n((?:[ \t]+.*\n|\n)*)", text, re.MULTILINE)
    return dict(blocks)


def test_catalog_file_has_the_catalogs_format():
    jsonschema.validate(catalog_settings(), CATALOG_SCHEMA)


@pytest.mark.parametrize(
    "broken",
    [
        {},  # no usage
        {"usage": {"report": True}},  # no deployment method
        {"usage": {"software-stack-deployment": {"conda": False, "singularity": False}}},  # none true
        {"usage": {"software-stack-deployment": {"conda": "yes"}}},  # not a boolean
        {"usage": {"software-stack-deployment": {"conda": True}, "mandatory_flags": {}}},  # misspelt key
        {"usage": {"software-stack-deployment": {"conda": True}, "report": "true"}},
    ],
)
def test_schema_refuses_a_broken_file(broken):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, CATALOG_SCHEMA)


def test_catalog_layout_beside_it():
    """What the catalog's generator requires for standardized usage: workflow/Snakefile, rule modules
    ending in .smk, config/README.md, a README naming snakemake and workflow."""
    assert (ROOT / "workflow" / "Snakefile").is_file()
    assert any((ROOT / "workflow" / "rules").glob("*.smk"))
    assert (ROOT / "config" / "README.md").is_file()
    readme = (ROOT / "README.md").read_text(encoding="utf-8").lower()
    assert "snakemake" in readme and "workflow" in readme


def test_what_the_file_promises_is_wired():
    """`conda: true`: every rule that runs a job names a conda env of workflow/envs/; `report: true`:
    some output is marked for Snakemake's report (tests/workflow/test_snakemake_report.py builds it)."""
    usage = catalog_settings()["usage"]
    rules = "\n".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "workflow/rules").glob("*.smk")))
    blocks = rule_blocks(rules)
    assert len(blocks) >= 9
    if usage["software-stack-deployment"].get("conda"):
        envs = {name: re.search(r'conda:\s*\n\s*"\.\./(envs/[^"]+)"', block) for name, block in blocks.items()}
        assert [name for name, env in envs.items() if env is None] == []
        assert all((ROOT / "workflow" / env.group(1)).is_file() for env in envs.values())
    if usage.get("report"):
        assert re.search(r"=report\(\s*directory\(", rules.replace(" ", "").replace("\n", ""))
