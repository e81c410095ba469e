"""A workflow job that asked for a GPU stops at once where none is usable (issue: silent CPU training):
rules train, search and preflight pass their `resources` gpu to the run as DMLREPRO_GPUS, so `device: auto`
refuses the CPU for a `gpu: 1` job (one line ends its log; nothing trained) and still takes it for a
`gpu: 0` one (docs/environment.md#gpu-driver). CUDA is hidden, as on a node without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dmlrepro.run_table import RunTable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
CONFIG = yaml.safe_load("""
data_root: data
results: results
resources: {train: {synthetic: {gpu: 0}, digits: {gpu: 1}}}
defaults:
  model: {backbone: tiny_cnn, embedding_size: 8}
  dataset: {image_size: 16, resize: 16, train_crop: random, batch_size: 8, sampler: m_per_class, m: 4}
  epochs: 1
  steps_per_epoch: 1
  eval: {every: 0, before_training: false, ks: [1]}
datasets:
  synthetic: {dataset: {name: synthetic, params: {num_classes: 4, images_per_class: 4}}}
  digits: {dataset: {name: digits}}
methods: {proxy_anchor: {loss: {name: proxy_anchor}}}
experiments:
  runs: {methods: [proxy_anchor], datasets: [synthetic, digits], seeds: [0], metrics: [recall@1]}
  searched:  # its search job asks for a GPU (resources.train.digits)
    methods: [proxy_anchor]
    datasets: [digits]
    overrides: {validation: {split: fold, n_folds: 2, fold: 0}, eval: {select: best_val}}
    search: {space: {optimizer.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}}, trials: 1, startup_trials: 1}
    metrics: [recall@1]
""")
[SEARCH] = RunTable(CONFIG).searches  # its id, as the workflow names it
TARGETS = ("results/experiments/runs.csv", f"results/search/{SEARCH}/trials.csv", "results/preflight/preflight.json")
LINE = "run config: device = 'auto' and its job asked for 1 GPU(s), but no GPU is usable: CUDA_VISIBLE_DEVICES='' hides"


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_request")
    (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env.pop("DMLREPRO_GPUS", None)
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(folder), "--configfile"]
    done = subprocess.run(
        [*command, str(folder / "config.yaml"), "--cores", "1", "--keep-going", *TARGETS],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    return folder, done


def _train_log(folder: Path, dataset: str) -> str:
    [log] = [p for p in (folder / "results/logs/train").glob("*.log") if f"-{dataset}-" in p.name]
    return log.read_text()


def _last_line(path: Path) -> str:
    return path.read_text().rstrip().splitlines()[-1]


def test_a_gpu_job_without_a_usable_gpu_stops_with_one_line(workflow):
    folder, done = workflow
    assert done.returncode != 0, done.stderr[-3000:]
    log = _train_log(folder, "digits")
    assert log.rstrip().splitlines()[-1].endswith(LINE + " every GPU (`dmlrepro doctor`)"), log[-3000:]
    # stopped before anything was built: its run folder (Snakemake made it) holds only the run's lock
    [run] = (folder / "results/runs").glob("*-digits-*")
    assert [p.name for p in run.iterdir() if p.name != ".lock"] == []


def test_a_job_without_a_gpu_request_trains_on_the_cpu(workflow):
    folder, _ = workflow
    [run] = (folder / "results/runs").glob("*-synthetic-*")
    record = json.loads((run / "metrics.json").read_text())
    assert record["status"] == "completed" and record["precision"]["device"] == "cpu"
    assert LINE not in _train_log(folder, "synthetic")


@pytest.mark.parametrize("log", [f"search/{SEARCH}.log", "preflight.log"])
def test_a_search_or_preflight_job_that_asked_for_a_gpu_stops_too(workflow, log):
    folder, _ = workflow
    assert LINE in _last_line(folder / "results/logs" / log), (folder / "results/logs" / log).read_text()[-3000:]
