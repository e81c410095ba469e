"""The workflow's targets end to end (docs/workflow.md#targets): a dataset that cannot be prepared
(Cars-196, no working download, nothing placed) leaves out only its runs; the report is built from
the rest and lists what is not run and why; a paper's and an experiment's target build their own report."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # trains 4 tiny runs

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = yaml.safe_load((REPO / "tests/workflow/tiny.yaml").read_text())


def config(tmp_path: Path) -> Path:
    """tiny.yaml's `table` (PFML and Proxy Anchor, 2 seeds) on synthetic and Cars-196, its `toy`
    (no dataset), and an experiment on Cars-196 alone; names with a paper's prefix."""
    table = {**TINY["experiments"]["table"], "datasets": ["synthetic", "cars196"]}
    table["report"] = {**table["report"], "datasets": {"synthetic": "CUB-200-2011", "cars196": "Cars-196"}}
    cars = {"methods": ["pfml"], "datasets": ["cars196"], "metrics": ["recall@1"]}
    doc = {
        **{k: v for k, v in TINY.items() if k != "experiments"},
        "data_root": str(tmp_path / "data"),
        "datasets": {**TINY["datasets"], "cars196": {"dataset": {"name": "cars196"}}},
        "experiments": {"pfml_table": table, "pfml_toy": TINY["experiments"]["toy"], "asap_cars": cars},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def snakemake(workdir: Path, *args: str) -> str:
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "--cores", "2", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env={**os.environ})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_missing_dataset_leaves_out_its_runs_and_the_report_says_why(tmp_path):
    path = config(tmp_path)
    out = snakemake(tmp_path, "all", "pfml", "asap_cars", f"--configfile={path}")
    assert "cars196" not in " ".join(line for line in out.splitlines() if line.startswith("Training run"))
    html = (tmp_path / "results/report/index.html").read_text()
    # the built sections, then a not-run row for the experiment left out and one for the one built in part
    assert 'id="pfml_table"' in html and 'id="asap_cars"' not in html
    assert "not run — cars196: not prepared, no working download" in html
    assert "not run — built without cars196" in html
    runs = sorted(p.name for p in (tmp_path / "results/runs").iterdir())
    assert len(runs) == 4 and all("synthetic" in name for name in runs), runs
    # the paper's target: its own report, PFML's sections only; the experiment's: no section, its reason
    pfml = (tmp_path / "results/targets/pfml/index.html").read_text()
    assert 'id="pfml_table"' in pfml and 'id="pfml_toy"' in pfml and "asap_cars" not in pfml
    cars = (tmp_path / "results/targets/asap_cars/index.html").read_text()
    assert "not run — cars196: not prepared" in cars and 'id="pfml_table"' not in cars
