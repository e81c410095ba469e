"""benchmarks/gpu_check.sh's plumbing, on the CPU (`CHECK=tiny`): it runs with the venv's Python, keeps its
generated images out of the logs it tars, records every step and writes the summary; its verdict fails a
full check without CUDA (at once, after the probe) and a lane that skipped a test (docs/benchmarks.md#the-gpu-check)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"


def _summary_module():
    spec = importlib.util.spec_from_file_location("gpu_check_summary", REPO / "benchmarks" / "gpu_check_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    full_env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "DATA_DIR": str(tmp_path / "data"),
        "PY": sys.executable,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        **env,
    }
    return subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_tiny_check_runs_every_step_on_the_cpu(tmp_path):
    r = _run(tmp_path, CHECK="tiny", BUDGET="400")
    out = tmp_path / "out"
    doc = json.loads((out / "gpu_check.json").read_text())
    steps = {s["step"]: s for s in doc["steps"]}
    assert r.returncode == 0, (r.stdout, r.stderr, doc["verdict"], steps)
    expected = ["probe", "cuda_lane", "suite_device_auto", "pipeline_all", "pipeline_8cpu", "epoch", "retrieval"]
    assert list(steps)[: len(expected)] == expected and "preflight_rsw_table2" in steps
    assert doc["miniature_preflight"]["total_hours"] > 0  # the miniature's data is not prepared there either
    failed = {name: s for name, s in steps.items() if s["exit"] != 0}
    assert not failed, failed
    lane = doc["cuda_lane"]
    assert lane["tests"] == lane["passed"] == 2, lane
    assert doc["probe"]["node"]["cpus_usable"] >= 1 and doc["preflight"]["configs"]
    assert doc["pipeline_8_cpus"] and doc["epoch"]
    with tarfile.open(out / "logs.tgz") as tar:
        names = tar.getnames()
    assert "./probe.log" in names and not any(n.endswith((".jpg", ".jpeg", ".png")) for n in names)
    assert any((tmp_path / "data").rglob("*.jp*g"))  # the generated images went to DATA_DIR
    assert "**Passed** (a CPU dry run" in (out / "gpu_check.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the verdict on a node without CUDA")
def test_full_check_without_cuda_stops_after_the_probe_and_fails(tmp_path):
    r = _run(tmp_path, CHECK="full")
    doc = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert r.returncode == 1 and [s["step"] for s in doc["steps"]] == ["probe"]
    assert "CUDA is not available" in r.stdout and "Failed" in (tmp_path / "out" / "gpu_check.md").read_text()


def test_without_the_venv_python_it_says_so(tmp_path):
    r = _run(tmp_path, PY=str(tmp_path / "no-python"))
    assert r.returncode == 2 and "run ./setup.sh first" in r.stderr


@pytest.mark.parametrize(
    "lane, cuda, check, failed",
    [
        ({"tests": 9, "failures": 0, "errors": 0, "skipped": 0}, True, "full", []),
        ({"tests": 9, "failures": 0, "errors": 0, "skipped": 1}, True, "full", ["1 skipped"]),
        ({"tests": 9, "failures": 1, "errors": 0, "skipped": 0}, True, "full", ["1 failed"]),
        (None, True, "full", ["did not run"]),
        ({"tests": 2, "failures": 0, "errors": 0, "skipped": 0}, False, "full", ["CUDA is not available"]),
        ({"tests": 2, "failures": 0, "errors": 0, "skipped": 0}, False, "tiny", []),
    ],
)
def test_the_verdict(lane, cuda, check, failed):
    problems = _summary_module().verdict({"probe": {"cuda_available": cuda}, "cuda_lane": lane}, check)
    assert len(problems) == len(failed) and all(f in p for f, p in zip(failed, problems)), problems
