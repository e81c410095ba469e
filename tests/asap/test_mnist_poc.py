"""ASAP's MNIST proof of concept at paper scale (config/paper.yaml, ASAP-R28) trains end to end:
the two run configs exactly as paper.yaml resolves them (ResNetV2-20 from scratch, 2-d, P = 4, b = 16,
10 % of each training digit validating, at most 4 alternations), shortened to a few steps, on a tiny
MNIST in the release's IDX layout (dmlrepro.data prepares it from local files: no network)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from dmlrepro.data.registry import prepare
from dmlrepro.evaluation import load_embeddings
from dmlrepro.runs import experiment_runs, resolve_runs
from dmlrepro.train import train_run

from ..data.conftest import tiny_mnist

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mnist")
    tiny = tiny_mnist(train_per_class=20, test_per_class=3)  # 10 %: 2 validation images per digit
    release = root / "release"
    release.mkdir()
    for name, data in tiny.files.items():
        (release / name).write_bytes(data)
    prepare("mnist", root / "data", archives=[str(release)], md5=tiny.md5, strict_counts=False, progress=False)
    return root / "data"


@pytest.fixture(scope="module")
def paper_runs():
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text(encoding="utf-8"))
    return {run.method: run for run in experiment_runs(resolve_runs(config), "asap_mnist_samples")}


@pytest.mark.parametrize("method", ["c2_asap_mnist", "c2_asap_mnist_samples"])
@pytest.mark.slow
def test_paper_config_trains_on_mnist_in_the_release_layout(mnist_root, paper_runs, method, tmp_path):
    cfg = copy.deepcopy(paper_runs[method].config)
    cfg["dataset"].update(root=str(mnist_root), eval_batch_size=64)
    # a few steps instead of up to 400 × 250: 2 steps per evaluation, alternate after 1 bad evaluation
    cfg.update(steps_per_epoch=2, epochs=6, threads=1, num_workers=0)
    cfg["asap"]["projection_patience"] = 1
    metrics = train_run(cfg, tmp_path / "run", progress=False)
    assert metrics["status"] == "completed"
    assert np.isfinite(metrics["metrics"]["map@r"])
    log = json.loads((tmp_path / "run" / "validation_log.json").read_text())
    assert len(log["evaluations"]) == 6
    assert 1 <= len(log["alternations"]) <= 4  # k-Center re-selections happened, capped by asap.max_alternations
    test = load_embeddings(tmp_path / "run" / "embeddings_test.npz")
    assert test.embeddings.shape == (30, 2) and sorted(set(test.labels.tolist())) == list(range(10))
