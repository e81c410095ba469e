"""Backend choice of the k-NN search and the faiss-GPU probe (decided without a GPU here)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from dmlrepro.evaluation import knn, knn_search
from dmlrepro.evaluation.knn import FAISS_GPU_MAX_K, import_faiss, resolve_backend, work_device


class FakeGpuFaiss:
    """Wraps real faiss; pretends to see ``gpus`` GPUs."""

    def __init__(self, gpus=2):
        self._faiss = import_faiss()
        self.gpus = gpus

    def __getattr__(self, name):
        return getattr(self._faiss, name)

    def get_num_gpus(self):
        return self.gpus

    class StandardGpuResources:  # noqa: D106
        pass


@pytest.fixture
def fake_faiss(monkeypatch):
    """A fake faiss with 2 GPUs and a probe outcome per GPU (True unless set)."""
    fake = FakeGpuFaiss()
    outcomes: dict[int, bool] = {}
    probed: list[int] = []

    def run_probe(gpu):
        probed.append(gpu)
        return outcomes.get(gpu, True)

    monkeypatch.setattr(knn, "import_faiss", lambda: fake)
    monkeypatch.setattr(knn, "_probe_cache", {})
    monkeypatch.setattr(knn, "_run_probe", run_probe)
    return fake, outcomes, probed


def test_auto_backend_routing(fake_faiss, monkeypatch):
    """auto: faiss-cpu on the CPU, torch on CUDA even where faiss sees the GPU (no probe, no faiss GPU search)."""
    fake, outcomes, probed = fake_faiss
    cpu, cuda1 = torch.device("cpu"), torch.device("cuda", 1)
    assert resolve_backend("auto", cpu, 10) == "faiss-cpu"
    assert resolve_backend("auto", cuda1, 10) == "torch"
    assert resolve_backend("auto", cuda1, FAISS_GPU_MAX_K + 1) == "torch"
    assert probed == []  # auto never starts the faiss GPU probe
    monkeypatch.setattr(knn, "import_faiss", lambda: (_ for _ in ()).throw(ImportError("no faiss")))
    assert resolve_backend("auto", cpu, 10) == "torch"  # no faiss at all
    assert resolve_backend("auto", cuda1, 10) == "torch"


@pytest.mark.parametrize(
    "device_type,faiss_installed,expected",
    [("cpu", True, "faiss-cpu"), ("cpu", False, "torch"), ("cuda", True, "torch"), ("cuda", False, "torch")],
)
def test_auto_backend_decision(device_type, faiss_installed, expected):
    assert knn.auto_backend(device_type, faiss_installed) == expected


def test_explicit_backends(fake_faiss):
    fake, outcomes, _ = fake_faiss
    cuda0 = torch.device("cuda", 0)
    assert resolve_backend("torch", cuda0, 10) == "torch"
    assert resolve_backend("faiss-cpu", cuda0, 10) == "faiss-cpu"
    assert resolve_backend("faiss-gpu", cuda0, 10) == "faiss-gpu"
    with pytest.raises(ValueError, match="cannot search k"):
        resolve_backend("faiss-gpu", cuda0, FAISS_GPU_MAX_K + 1)
    outcomes[1] = False
    with pytest.raises(ValueError, match="probe search on GPU 1 failed"):
        resolve_backend("faiss-gpu", torch.device("cuda", 1), 10)
    fake.gpus = 0
    with pytest.raises(ValueError, match="faiss sees 0 GPU.*use 'torch'"):
        resolve_backend("faiss-gpu", cuda0, 10)
    with pytest.raises(ValueError, match="knn backend must be one of"):
        resolve_backend("annoy", cuda0, 10)


def test_probe_subprocess_abort_is_caught_and_cached(monkeypatch, caplog):
    # A faiss wheel without kernels for the GPU aborts the process: the probe runs in a child,
    # so an abort there is a False here, logged, and asked only once per process.
    monkeypatch.setattr(knn, "_probe_cache", {})
    monkeypatch.setattr(knn, "_PROBE_CODE", "import os, sys; sys.stderr.write('no kernel image'); os.abort()")
    with caplog.at_level(logging.WARNING, logger="dmlrepro.evaluation.knn"):
        assert knn.faiss_gpu_usable(0) is False
    assert "no kernel image" in caplog.text
    monkeypatch.setattr(knn, "_PROBE_CODE", "print('ok')")
    assert knn.faiss_gpu_usable(0) is False  # cached for the process
    assert knn.faiss_gpu_usable(1) is True  # another GPU: its own probe
    monkeypatch.setattr(knn, "_PROBE_CODE", "import sys; print('wrong'); sys.exit(0)")
    assert knn._run_probe(2) is False  # a wrong answer is a failure too


def test_probe_code_is_a_real_faiss_gpu_search():
    # The probe itself: on this machine (faiss-cpu, no GPU) it must fail cleanly, not hang.
    faiss = import_faiss()
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("faiss has GPU support here")
    assert knn._run_probe(0) is False


def test_work_device():
    assert work_device(None, (np.zeros((2, 2)), None)) == torch.device("cpu")
    assert work_device(None, (torch.zeros(2, 2), None)) == torch.device("cpu")
    assert work_device("cpu", (torch.zeros(2, 2),)) == torch.device("cpu")
    with pytest.raises(ValueError, match="device must be"):
        work_device("tpu", (None,))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
            work_device("cuda", (None,))


@pytest.mark.parametrize("backend", ["faiss-cpu", "torch"])
def test_knn_scores_and_clamping(backend):
    x = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]], dtype=np.float32)
    d, i = knn_search(x, 10, backend=backend)  # k clamped to N-1 = 2
    np.testing.assert_array_equal(i, [[1, 2], [0, 2], [1, 0]])
    np.testing.assert_allclose(d, [[1, 9], [1, 4], [4, 9]])  # squared L2, ascending
    s, i = knn_search(x[1:], 1, x, distance="cosine", backend=backend)  # query -> reference, cosine similarity
    assert i.shape == (2, 1) and np.all(s[:, 0] == pytest.approx(1.0))
