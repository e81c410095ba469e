"""The Snakemake workflow catalog's layout, and no conda environment the CI cannot test (docs/workflow.md#layout,
docs/preflight.md#conda).

The catalog lists a workflow with its layout (workflow/Snakefile, rule modules ending in .smk, config/README.md,
a README naming snakemake and workflow). Its "standardized usage" file, `.snakemake-workflow-catalog.yml`,
requires a conda or container deployment; this workflow runs its jobs in ./setup.sh's .venv, which CI tests,
and has neither: no conda files, no `conda:` directive, no catalog file promising them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rule_blocks(text: str) -> dict[str, str]:
    """rule or checkpoint name -> its text, up to the next top-level line."""
    blocks = re.findall(r"^(?:rule|checkpoint) (\w+):\n((?:[ \t]+.*\n|\n)*)", text, re.MULTILINE)
    return dict(blocks)


def test_catalog_layout():
    assert (ROOT / "workflow" / "Snakefile").is_file()
    assert any((ROOT / "workflow" / "rules").glob("*.smk"))
    assert (ROOT / "config" / "README.md").is_file()
    readme = (ROOT / "README.md").read_text(encoding="utf-8").lower()
    assert "snakemake" in readme and "workflow" in readme


def test_no_untested_conda_environment():
    rules = "\n".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "workflow/rules").glob("*.smk")))
    blocks = rule_blocks(rules)
    assert len(blocks) >= 9
    assert [name for name, block in blocks.items() if re.search(r"^\s+conda:", block, re.MULTILINE)] == []
    assert not (ROOT / "workflow" / "envs").exists()
    assert not (ROOT / ".snakemake-workflow-catalog.yml").exists()


def test_the_report_is_wired():
    """Some output is marked for Snakemake's report (tests/workflow/test_snakemake_report.py builds it)."""
    rules = "\n".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "workflow/rules").glob("*.smk")))
    assert re.search(r"=report\(\s*directory\(", rules.replace(" ", "").replace("\n", ""))
