"""Every k-NN search runs its matrix products in exact float32 (TF32 off), whatever a run set for training
(`speed.tf32`), and leaves torch's setting as it found it: observed on the CPU through torch's flags at
the moment the search's matmul runs (docs/evaluation.md#precision)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from dmlrepro.evaluation import compute_retrieval, evaluate_embeddings_file, knn_search, save_embeddings
from dmlrepro.evaluation.knn import exact_float32


def _flags() -> tuple[bool, str]:
    return torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()


@pytest.fixture
def search_flags(monkeypatch):
    """The (allow_tf32, float32 matmul precision) of every torch.mm / torch.addmm the search module calls."""
    seen: list[tuple[bool, str]] = []
    for name in ("mm", "addmm"):
        original = getattr(torch, name)

        def recorded(*args, _original=original, **kwargs):
            if sys._getframe(1).f_globals.get("__name__") == "dmlrepro.evaluation.knn":
                seen.append(_flags())
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch, name, recorded)
    return seen


@pytest.fixture(params=["legacy flag", "matmul precision"])
def tf32_on(request):
    """TF32 allowed as the engine allows it (the CUDA matmul flag) or as a caller might
    (torch.set_float32_matmul_precision("high")); reset after."""
    matmul = torch.backends.cuda.matmul
    if request.param == "legacy flag":
        matmul.allow_tf32 = True
    else:
        torch.set_float32_matmul_precision("high")
    before = _flags()
    assert before == (True, "high")
    yield before
    torch.set_float32_matmul_precision("highest")
    matmul.allow_tf32 = False


def _data(n=300, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, 12, size=n)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_retrieval_and_knn_search_turn_tf32_off(search_flags, tf32_on, distance):
    x, y = _data()
    compute_retrieval(x, y, (1, 2, 4), distance=distance, backend="torch", chunk_size=64)
    knn_search(x[:50], 5, x, distance=distance, backend="torch")
    assert search_flags and set(search_flags) == {(False, "highest")}
    assert _flags() == tf32_on  # restored


def test_evaluate_turns_tf32_off(search_flags, tf32_on, tmp_path):
    """`dmlrepro evaluate`'s path: a saved embeddings file to metrics.json."""
    x, y = _data()
    path = tmp_path / "embeddings_test.npz"
    save_embeddings(path, x, y, np.arange(len(y)), split="test")
    out = evaluate_embeddings_file(path, tmp_path / "metrics.json", ks=(1, 2), backend="torch")
    assert out["precision"] == {"search": "float32"}
    assert search_flags and set(search_flags) == {(False, "highest")}
    assert _flags() == tf32_on


def test_exact_float32_restores_after_an_error(tf32_on):
    with pytest.raises(RuntimeError), exact_float32():
        assert _flags() == (False, "highest")
        raise RuntimeError("inside")
    assert _flags() == tf32_on


def test_exact_float32_leaves_the_default_alone():
    before = _flags()
    assert before == (False, "highest")
    with exact_float32():
        assert _flags() == before
    assert _flags() == before
