"""The workflow config's `resources` block (SLURM requests of the training jobs) without a cluster:
a bad entry stops the workflow before any job, with a message naming it (docs/slurm.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # snakemake dry runs

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = REPO / "tests/workflow/tiny.yaml"


def dry_run(tmp_path: Path, resources: dict) -> subprocess.CompletedProcess:
    config = yaml.safe_load(TINY.read_text())
    config["resources"] = resources
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--configfile",
        str(path),
        "--cores",
        "1",
        "-n",
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_per_dataset_resources_are_accepted(tmp_path):
    done = dry_run(
        tmp_path,
        {"train": {"default": {"runtime": 30, "mem_mb": 2000, "gpu": 1, "warning": 120}, "synthetic": {"runtime": 90}}},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.parametrize(
    "resources, named",
    [
        ({"train": {"cub200": {"runtime": 60}}}, "resources.train.cub200"),  # not a dataset of this config
        ({"train": {"default": {"runtime": 5, "warning": 300}}}, "warning = 300"),  # the signal would come at once
        ({"train": {"default": {"gpus": 1}}}, "gpus"),  # schema: unknown key
        ({"train": {"default": {"runtime": 0}}}, "runtime"),  # schema: minimum 1
    ],
)
def test_a_bad_entry_is_rejected_before_any_job(tmp_path, resources, named):
    done = dry_run(tmp_path, resources)
    assert done.returncode != 0 and named in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
