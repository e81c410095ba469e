"""Device routing of the faiss search (GPU use is decided without needing a GPU here)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from dmlrepro.evaluation import knn_search
from dmlrepro.evaluation.knn import FAISS_GPU_MAX_K, _build_index, _resolve_gpu, import_faiss


class FakeGpuFaiss:
    """Wraps real faiss; pretends to have 2 GPUs and records CPU->GPU index moves."""

    def __init__(self):
        self._faiss = import_faiss()
        self.moved = []

    def __getattr__(self, name):
        return getattr(self._faiss, name)

    def get_num_gpus(self):
        return 2

    class StandardGpuResources:  # noqa: D106
        pass

    def index_cpu_to_gpu(self, res, gpu, index):
        self.moved.append(gpu)
        return index  # searching stays on CPU, only the routing is under test


class FakeCudaTensor:
    """Looks like a torch CUDA tensor to the routing code."""

    __module__ = "torch"

    def __init__(self, index):
        self.is_cuda = True
        self.device = type("D", (), {"index": index})()

    def detach(self):  # pragma: no cover - not called by _resolve_gpu
        raise AssertionError


def test_resolve_gpu():
    fake = FakeGpuFaiss()
    assert _resolve_gpu(None, (np.zeros((2, 2)), None), fake) is None  # numpy input: CPU
    assert _resolve_gpu(None, (FakeCudaTensor(1), None), fake) == 1  # CUDA input: its GPU
    assert _resolve_gpu("cpu", (FakeCudaTensor(0), None), fake) is None
    assert _resolve_gpu("cuda", (np.zeros((2, 2)),), fake) == 0
    assert _resolve_gpu("cuda:1", (np.zeros((2, 2)),), fake) == 1
    with pytest.raises(ValueError, match="faiss sees 2 GPU"):
        _resolve_gpu("cuda:2", (np.zeros((2, 2)),), fake)
    with pytest.raises(ValueError, match="device must be"):
        _resolve_gpu("tpu", (np.zeros((2, 2)),), fake)
    real = import_faiss()
    if not (hasattr(real, "StandardGpuResources") and real.get_num_gpus() > 0):
        # CUDA input but a CPU-only faiss: fall back to the CPU (documented), no error.
        assert _resolve_gpu(None, (FakeCudaTensor(0), None), real) is None


def test_gpu_index_only_up_to_faiss_gpu_max_k(caplog):
    fake = FakeGpuFaiss()
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    _build_index(x, "euclidean", 0, FAISS_GPU_MAX_K, fake)
    assert fake.moved == [0]
    with caplog.at_level(logging.WARNING, logger="dmlrepro.evaluation.knn"):
        _build_index(x, "cosine", 1, FAISS_GPU_MAX_K + 1, fake)
    assert fake.moved == [0]  # not moved: k too large for the GPU
    assert "faiss GPU maximum" in caplog.text


def test_knn_scores_and_clamping():
    x = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]], dtype=np.float32)
    d, i = knn_search(x, 10)  # k clamped to N-1 = 2
    np.testing.assert_array_equal(i, [[1, 2], [0, 2], [1, 0]])
    np.testing.assert_allclose(d, [[1, 9], [1, 4], [4, 9]])  # squared L2, ascending
    s, i = knn_search(x[1:], 1, x, distance="cosine")  # query -> reference, cosine similarity
    assert i.shape == (2, 1) and np.all(s[:, 0] == pytest.approx(1.0))
