"""`snakemake --report report.zip` after a finished workflow (docs/workflow.md#snakemakes-report): the zip
carries the project's report folder (index.html, its figures, claims.json) and Snakemake's own page with
the rule graph, the jobs' runtimes and each rule's code; both pages open from the zip in Chromium.

The workflow is a two-experiment cut of tests/workflow/tiny.yaml (a table of 2 runs beside its published
numbers, and the toy-field figure, which trains nothing), run from another working directory so that the
checkout's own files are found from workflow/Snakefile, not from the working directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY = Path(__file__).with_name("tiny.yaml")
#: the jobs of the cut: prepare_dataset, 2 × train, 2 × aggregate, 2 × report_section, report, all
RULES = {"prepare_dataset", "train", "aggregate", "report_section", "report", "all"}


def snakemake(workdir: Path, config: Path, *args: str) -> None:
    done = subprocess.run(
        [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory", str(workdir)]
        + ["--configfile", str(config), "--cores", "2", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "TMPDIR": str(workdir)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def unzipped(tmp_path_factory) -> dict[str, Path]:
    """The finished workflow's folder and its Snakemake report, built and unzipped."""
    workdir = tmp_path_factory.mktemp("workflow")
    config = yaml.safe_load(TINY.read_text())
    experiments = config["experiments"]
    config["experiments"] = {"table": {**experiments["table"], "seeds": [0]}, "toy": experiments["toy"]}
    config_file = workdir / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    snakemake(workdir, config_file)
    report_zip = tmp_path_factory.mktemp("zip") / "snakemake_report.zip"
    snakemake(workdir, config_file, "--report", str(report_zip))
    out = report_zip.parent / "unzipped"
    with zipfile.ZipFile(report_zip) as archive:
        archive.extractall(out)
    return {"workdir": workdir, "report": out / "snakemake_report"}


def project_page(report: Path) -> Path:
    (index,) = (report / "data" / "raw").glob("*/index.html")
    return index


def report_variables(report: Path) -> dict:
    """The data Snakemake's page is drawn from: its `var name = {json};` script blocks."""
    page = (report / "report.html").read_text(encoding="utf-8")
    found = re.findall(r"^\s*var (\w+) = (.*);\s*</script>", page, re.MULTILINE)
    return {name: json.loads(value) for name, value in found}


def test_zip_carries_the_projects_report_folder(unzipped):
    built = unzipped["workdir"] / "results" / "report"
    index = project_page(unzipped["report"])
    assert index.read_bytes() == (built / "index.html").read_bytes()
    assert (index.parent / "claims.json").read_bytes() == (built / "claims.json").read_bytes()
    images = re.findall(r'<img src="([^"]+)"', index.read_text(encoding="utf-8"))
    assert images and all((index.parent / src).is_file() for src in images)  # figures/ came along
    assert sorted(p.name for p in (index.parent / "figures").iterdir()) == sorted(
        p.name for p in (built / "figures").iterdir()
    )


def test_snakemake_page_has_the_graph_runtimes_and_provenance(unzipped):
    report = unzipped["report"]
    variables = report_variables(report)
    (result,) = variables["results"].values()
    assert result["job_properties"]["rule"] == "report"
    assert result["data_uri"] == project_page(report).relative_to(report).as_posix()
    assert "project's own report" in result["caption"]  # workflow/report/report.rst
    assert "Report" in json.dumps(variables["categories"])
    assert "three deep-metric-learning papers" in json.dumps(variables["workflow_desc"])  # workflow/report/workflow.rst
    nodes = {node["rule"] for node in variables["rulegraph_spec"]["data"][0]["values"]}
    assert RULES <= nodes
    assert {row["rule"] for row in variables["runtimes_spec"]["data"]["values"]} == RULES - {"all"}
    rules = variables["rules"]
    assert RULES - {"all"} <= set(rules) and "train_run" in "".join(rules["train"]["code"])  # the script's code


def check_report(page: Path) -> str:
    """`dmlrepro check-report` on a page; its summary line."""
    done = subprocess.run(
        [str(BIN / "dmlrepro"), "check-report", str(page)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_both_pages_open_from_the_zip_in_chromium(chromium, unzipped):
    index = project_page(unzipped["report"])
    images = len(re.findall(r'<img src="', index.read_text(encoding="utf-8")))
    assert check_report(index).startswith(f"{images} images, 0 broken [], 0 console messages")
    # Snakemake's page is drawn by its scripts: how many images exist by the load event varies
    assert re.match(r"\d+ images, 0 broken \[\], 0 console messages", check_report(unzipped["report"] / "report.html"))
