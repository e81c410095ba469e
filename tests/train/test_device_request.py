"""A run that asked for a GPU and cannot use one stops at once with one line saying why (no CUDA device,
CUDA hidden, a driver too old for torch's CUDA, a CPU-only torch); `device: auto` falls back to the CPU
only where no GPU was requested; `speed.tf32` sets cuDNN's TF32 as well as the matmuls'; `dmlrepro doctor`
prints the node's facts (docs/environment.md#gpu-driver)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from dmlrepro.cpu_isa import kernel_digest
from dmlrepro.train import runtime
from dmlrepro.train.config import ConfigError
from dmlrepro.train.runtime import apply_speed, driver_version, gpu_unusable_reason, resolve_device, restore_speed

from .conftest import REPO, run_cli

NO_GPU = not torch.cuda.is_available()


@pytest.fixture
def no_gpu(monkeypatch):
    """A CUDA build of torch on a node whose driver (580 unless a test says otherwise) shows no device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(runtime, "driver_version", lambda: "580.65.06")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("DMLREPRO_GPUS", raising=False)
    monkeypatch.delenv("DMLREPRO_GPU_SLOT", raising=False)
    return monkeypatch


def test_auto_falls_back_to_the_cpu_only_where_no_gpu_was_requested(no_gpu):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    no_gpu.setenv("DMLREPRO_GPUS", "1")
    with pytest.raises(ConfigError, match=r"device = 'auto' and its job asked for 1 GPU\(s\)"):
        resolve_device("auto")
    assert resolve_device("cpu") == torch.device("cpu")  # an explicit CPU run is what it says
    no_gpu.delenv("DMLREPRO_GPUS")
    no_gpu.setenv("DMLREPRO_GPU_SLOT", "2,3")  # the workflow's GPU slots (dmlrepro.gpu_slots)
    with pytest.raises(ConfigError, match=r"asked for 2 GPU\(s\)"):
        resolve_device("auto")


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_an_explicit_cuda_device_must_be_usable(no_gpu, name):
    with pytest.raises(ConfigError, match=rf"device = '{name}', but no GPU is usable: NVIDIA driver 580"):
        resolve_device(name)


@pytest.mark.parametrize(
    "setup, expected",
    [
        ({"cuda": None}, r"torch \S+ is a CPU-only build"),
        ({"visible": ""}, r"CUDA_VISIBLE_DEVICES='' hides every GPU"),
        ({"visible": "-1"}, r"CUDA_VISIBLE_DEVICES='-1' hides every GPU"),
        ({"driver": None}, r"no NVIDIA driver is loaded"),
        ({"driver": "535.104.05"}, r"NVIDIA driver 535.104.05 is too old for torch \S+ \(CUDA 13.0 needs >= 580\)"),
        ({"driver": "550.54.15", "cuda": "12.4"}, r"driver 550.54.15 is loaded but torch sees no CUDA device"),
        ({"visible": "3"}, r"driver 580.65.06 is loaded but torch sees no CUDA device \(CUDA_VISIBLE_DEVICES='3'\)"),
    ],
)
def test_the_reason_names_what_is_missing(no_gpu, setup, expected):
    if "cuda" in setup:
        no_gpu.setattr(torch.version, "cuda", setup["cuda"])
    if "visible" in setup:
        no_gpu.setenv("CUDA_VISIBLE_DEVICES", setup["visible"])
    if "driver" in setup:
        no_gpu.setattr(runtime, "driver_version", lambda: setup["driver"])
    reason = gpu_unusable_reason()
    assert "\n" not in reason
    assert re.search(expected, reason), reason


@pytest.mark.parametrize(
    "text, version",
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n", "535.104.05"),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder)\n",
            "580.65.06",
        ),
    ],
)
def test_the_driver_version_is_read_from_the_kernel_module(tmp_path, text, version):
    proc = tmp_path / "version"
    proc.write_text(text)
    assert driver_version(proc) == version


@pytest.mark.skipif(not NO_GPU, reason="needs a node where torch sees no GPU")
@pytest.mark.parametrize(
    "device, env, says",
    [
        ("cuda", {"CUDA_VISIBLE_DEVICES": ""}, "device = 'cuda', but no GPU is usable"),
        ("auto", {"CUDA_VISIBLE_DEVICES": "", "DMLREPRO_GPUS": "1"}, "its job asked for 1 GPU(s)"),
    ],
)
def test_train_stops_in_one_line_before_building_anything(tiny, tmp_path, device, env, says):
    import yaml

    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump(tiny(device=device)))
    r = run_cli(["train", str(conf), str(tmp_path / "run")], env)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and says in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()  # no run folder, no data, no model


def test_cudnn_tf32_follows_speed_tf32():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (cudnn.benchmark, matmul.allow_tf32, cudnn.allow_tf32)
    try:
        cudnn.allow_tf32 = True  # torch's default
        prev = apply_speed({"cudnn_benchmark": False, "tf32": False}, deterministic=True)
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, False)
        restore_speed(prev)
        assert cudnn.allow_tf32 is True
        prev = apply_speed({"cudnn_benchmark": False, "tf32": True}, deterministic=True)
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
        restore_speed(prev)
    finally:
        cudnn.benchmark, matmul.allow_tf32, cudnn.allow_tf32 = before


def _doctor(*args, **env):
    import os

    return subprocess.run(
        [sys.executable, "-m", "dmlrepro.cli", "doctor", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        timeout=120,
    )


def test_doctor_prints_the_nodes_facts_on_one_screen():
    r = _doctor()
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) <= 24
    for head in ("torch", "driver", "GPU", "job", "CPU", "bits", "CPUs", "faiss"):
        assert any(line.startswith(head + " ") for line in lines), (head, r.stdout)
    facts = json.loads(_doctor("--json").stdout)
    assert facts["torch"] == torch.__version__ and facts["torch_cuda"] == torch.version.cuda
    assert facts["kernel_digest"] == kernel_digest()  # this process's kernels: the same pin, the same host
    assert facts["cpus_usable"] >= 1 and isinstance(facts["cpu_flags"], list)


@pytest.mark.skipif(not NO_GPU, reason="needs a node where torch sees no GPU")
def test_doctor_fails_where_a_gpu_was_requested_and_none_is_usable():
    r = _doctor(DMLREPRO_GPUS="1", CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 1 and "not usable: CUDA_VISIBLE_DEVICES='' hides every GPU" in r.stdout
    assert _doctor("--require-gpu").returncode == 1
