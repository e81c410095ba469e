"""Evaluation is float32 whatever the run trains in (docs/readings/protocols.md#proto-r9): the
Embedder and compute_embeddings leave an outer autocast, a run trained under bfloat16 autocast
stores float32 test embeddings, and `dmlrepro evaluate` recomputes its metrics exactly; the
device is resolved once per run."""

from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
import torch
import yaml

from dmlrepro.train import train_run
from dmlrepro.train.embedder import Embedder
from dmlrepro.train.precision import float32_inference, precision_name, training_amp_dtype
from dmlrepro.train.run_evaluation import compute_embeddings, evaluate_run

from .conftest import run_cli

BF16 = {"enabled": True, "dtype": "bfloat16"}


class _Images(torch.utils.data.Dataset):
    def __init__(self, n=24, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y, self.rows = torch.randn(n, 3, 8, 8, generator=g), torch.arange(n) % 3, list(range(n))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(288, 5))


def _low_bits_used(emb) -> bool:
    """Whether any float32 value uses the 16 mantissa bits bfloat16 drops."""
    return bool((np.ascontiguousarray(emb, dtype=np.float32).view(np.uint32) & 0xFFFF).any())


def test_embeddings_are_float32_inside_an_outer_bf16_autocast():
    model, ds = _model(), _Images()
    with torch.no_grad():
        expected = model(ds.x).numpy()
    cpu = torch.device("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the training step leaves the process
        a, _, _ = compute_embeddings(model, ds, batch_size=10, device=cpu)
        b, _, _ = Embedder(model, cpu, batch_size=10).embed(ds)
    assert _low_bits_used(a) and _low_bits_used(b)
    np.testing.assert_allclose(a, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b, expected, rtol=1e-6, atol=1e-6)


def test_float32_inference_turns_tf32_off_and_restores_it():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = cudnn.allow_tf32 = True
    try:
        with float32_inference(torch.device("cpu")):
            assert not matmul.allow_tf32 and not cudnn.allow_tf32
            assert not torch.is_autocast_enabled("cpu")
        assert matmul.allow_tf32 and cudnn.allow_tf32
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before


@pytest.mark.parametrize(
    "enabled, device, expected",
    [("auto", "cpu", None), ("auto", "cuda", torch.bfloat16), (True, "cpu", torch.bfloat16), (False, "cuda", None)],
)
def test_training_autocasts_where_amp_says(enabled, device, expected):
    cfg = {"amp": {"enabled": enabled, "dtype": "bfloat16"}}
    assert training_amp_dtype(cfg, torch.device(device)) == expected


def test_precision_names():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert precision_name(None, cpu, tf32=True) == "float32"  # TF32 is a CUDA matmul mode
    assert precision_name(None, cuda, tf32=True) == "float32 (TF32 matmuls)"
    assert precision_name(torch.bfloat16, cuda) == "bfloat16 autocast"
    assert precision_name(torch.float16, cuda) == "float16 autocast + GradScaler"


@pytest.mark.slow
def test_bf16_run_stores_float32_embeddings_and_evaluate_reproduces_its_metrics(tiny, tmp_path):
    out = tmp_path / "run"
    record = train_run(tiny(amp=BF16, loss={"name": "proxy_anchor"}), out, progress=False)
    precision = record["precision"]
    assert {k: precision[k] for k in ("device", "train", "eval", "search")} == {
        "device": "cpu",
        "train": "bfloat16 autocast",
        "eval": "float32",
        "search": "float32",
    }
    emb = np.load(out / "embeddings_test.npz")["embeddings"]
    assert emb.dtype == np.float32 and _low_bits_used(emb)
    # recomputed from the final checkpoint through `dmlrepro evaluate`, as a user would
    shutil.copy(out / "embeddings_test.npz", tmp_path / "trained.npz")
    (out / "embeddings_test.npz").unlink()
    r = run_cli(["evaluate", str(out)])
    assert r.returncode == 0, r.stderr
    again = json.loads((out / "metrics.json").read_text())
    assert again["metrics"] == record["metrics"]
    assert np.array_equal(np.load(out / "embeddings_test.npz")["embeddings"], emb)
    assert evaluate_run(out)["metrics"] == record["metrics"]  # and from the saved embeddings


@pytest.mark.slow
def test_the_device_is_resolved_once_per_run(tiny, tmp_path, monkeypatch):
    """`device: auto` is decided once, by resolve_runtime; any later resolution (here one that
    would find a GPU) would move part of the run elsewhere."""
    from dmlrepro.train import runtime

    original, calls = runtime.resolve_device, []

    def resolve_once(name):
        calls.append(name)
        if len(calls) > 1:
            raise AssertionError(f"device resolved again ({calls})")
        return original(name)

    for module in [m for name, m in sys.modules.items() if name.startswith("dmlrepro")]:
        if getattr(module, "resolve_device", None) is original:
            monkeypatch.setattr(module, "resolve_device", resolve_once)
    record = train_run(tiny(device="auto"), tmp_path / "run", progress=False)
    assert calls == ["auto"] and record["status"] == "completed"
    assert record["precision"]["device"] == yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["device"]


def _knn_flags(monkeypatch) -> list[tuple[bool, bool]]:
    """(matmul TF32, cuDNN TF32) at every torch.mm / torch.addmm of the k-NN search module."""
    seen = []
    for name in ("mm", "addmm"):
        original = getattr(torch, name)

        def recorded(*args, _original=original, **kwargs):
            if sys._getframe(1).f_globals.get("__name__") == "dmlrepro.evaluation.knn":
                seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
            return _original(*args, **kwargs)

        monkeypatch.setattr(torch, name, recorded)
    return seen


@pytest.mark.slow
def test_a_tf32_run_searches_in_float32_and_records_what_ran(tiny, tmp_path, monkeypatch):
    """speed.tf32 turns TF32 on for training (matmuls and cuDNN); every search of the run (each epoch's
    evaluation, the model selection's, the final metrics) and `dmlrepro evaluate` run with it off;
    metrics.json says so. On the CPU, through torch's flags (the torch backend: faiss has no TF32)."""
    seen = _knn_flags(monkeypatch)
    cfg = tiny(speed={"tf32": True, "knn_backend": "torch"}, eval={"select": "best_test"})
    record = train_run(cfg, tmp_path / "run", progress=False)
    assert len(seen) >= cfg["epochs"] + 2 and set(seen) == {(False, True)}  # cuDNN's flag is not the search's
    p = record["precision"]
    assert (p["matmul_tf32"], p["cudnn_tf32"], p["search"]) == (True, True, "float32")
    assert p["device_name"] and p["gpu_uuid"] is None and "pair_search_path" in p
    seen.clear()
    matmul = torch.backends.cuda.matmul
    matmul.allow_tf32 = True
    try:
        assert evaluate_run(tmp_path / "run")["metrics"] == record["metrics"]
    finally:
        matmul.allow_tf32 = False
    assert seen and {m for m, _ in seen} == {False}


def test_the_record_names_the_loss_pair_search_and_the_tf32_flags():
    from dmlrepro.train.precision import precision_record
    from dmlrepro.train.runtime import apply_speed, restore_speed

    class Loss:
        pair_search_path = "neighbour_list"

    cpu = torch.device("cpu")
    prev = apply_speed({"cudnn_benchmark": False, "tf32": False}, deterministic=True)
    try:
        record = precision_record(None, cpu, False, Loss())
    finally:
        restore_speed(prev)
    assert (record["matmul_tf32"], record["cudnn_tf32"], record["pair_search_path"]) == (False, False, "neighbour_list")
    assert precision_record(None, cpu, False, object())["pair_search_path"] is None
    assert record["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES")
