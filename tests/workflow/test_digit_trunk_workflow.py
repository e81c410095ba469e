"""A run that fine-tunes from the digit-pretrained trunk, end to end (tiny_digits.yaml): Snakemake
prepares double_digits (embedded), pretrains the trunk once, trains from it and evaluates; rule train
takes the weights file as input (docs/models.md#the-digit-pretrained-trunk)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK

# about 30 s on 2 cores at 1 torch thread (the trunk's pretraining always uses 2)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
CONFIG = Path(__file__).with_name("tiny_digits.yaml")


def snakemake(workdir: Path, *args: str, config: Path = CONFIG) -> str:
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(workdir)]
    command += ["--configfile", str(config), "--cores", "1", *args]
    env = {**os.environ, "TMPDIR": str(workdir), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_run_fine_tunes_from_the_digit_trunk(tmp_path):
    snakemake(tmp_path)
    recipe = DIGIT_TRUNK.resolve(yaml.safe_load(CONFIG.read_text())["defaults"]["model"]["digit_trunk"])
    weights = tmp_path / "results" / "standin" / f"digits-{DIGIT_TRUNK.hash(recipe)}.pt"
    assert sorted(p.name for p in weights.parent.iterdir()) == [weights.name]  # pretrained once
    (run,) = (tmp_path / "results" / "runs").iterdir()
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["pretrained"] == "digit_trunk" and config["model"]["digit_trunk"] == recipe
    assert Path(config["model"]["weights_cache_dir"]) == Path("results/standin")
    metrics = json.loads((run / "metrics.json").read_text())["metrics"]
    assert 0.0 < metrics["recall@1"] <= 1.0
    # rule train takes the weights as input: a new trunk plans the run again
    planned = snakemake(tmp_path, "-n", "--forcerun", "pretrain_digit_trunk")
    assert "pretrain_digit_trunk" in planned and f"Training run {run.name}" in planned


@pytest.mark.parametrize("name", ["double_mnist", "triple_mnist"])
def test_the_mnist_sets_wait_for_a_prepared_mnist(tmp_path, name):
    """Rule prepare_dataset makes double_mnist / triple_mnist from the prepared mnist (its manifest is
    the input) unless their params name a local copy (`source`)."""
    config = yaml.safe_load(CONFIG.read_text())
    config["datasets"] = {name: {"dataset": {"name": name}}}
    config["experiments"]["table"]["datasets"] = [name]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert "Preparing dataset mnist" in snakemake(tmp_path, "-n", config=path)
    config["datasets"][name]["dataset"]["params"] = {"source": str(tmp_path / "copy")}
    path.write_text(yaml.safe_dump(config))
    assert "Preparing dataset mnist" not in snakemake(tmp_path, "-n", config=path)
