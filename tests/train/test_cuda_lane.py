"""The CUDA lane (docs/testing.md#the-cuda-lane): the engine behaviours that matter on a GPU, run on
CUDA where one is visible and skipped elsewhere (`pytest -m cuda` says how many ran). Bit-for-bit
resumes after SIGTERM and SIGKILL with `deterministic: true`; float16 with the GradScaler, clipping
and a signal mid-run; bfloat16 autocast with float32 evaluation that `dmlrepro evaluate` reproduces
(and agrees with on the CPU within a measured tolerance); a checkpoint moved between devices; ASAP's
validation. `DMLREPRO_CUDA_LANE_DEVICE=cpu` runs the same tests on the CPU."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dmlrepro.train import EXIT_INTERRUPTED, list_checkpoints, read_checkpoint

from .conftest import REPO, run_cli, tiny_config
from .test_amp_resume import _same
from .test_resume import OVERRIDES, _assert_identical
from .test_validation_asap import asap_config

pytestmark = [pytest.mark.cuda, pytest.mark.slow, pytest.mark.timeout(1800)]

#: the largest CPU-vs-GPU differences `dmlrepro evaluate --device cpu` may show on a GPU-trained run:
#: float32 kernels differ in summation order only (docs/evaluation.md#precision)
EMBEDDING_ATOL, METRIC_ATOL = 1e-4, 0.01


def _conf(tmp_path: Path, cfg: dict, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _train(conf: str, out: Path, **env) -> int:
    r = run_cli(["train", conf, str(out), "--no-progress"], {k: str(v) for k, v in env.items()})
    if r.returncode not in (0, EXIT_INTERRUPTED, -signal.SIGKILL):
        raise AssertionError(r.stderr)
    return r.returncode


def _low_bits_used(emb: np.ndarray) -> bool:
    return bool((np.ascontiguousarray(emb, dtype=np.float32).view(np.uint32) & 0xFFFF).any())


def _lane_record(name: str, values: dict) -> None:
    """What the lane measured, for benchmarks/gpu_check.sh (DMLREPRO_LANE_RECORD: a folder)."""
    folder = os.environ.get("DMLREPRO_LANE_RECORD")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.json").write_text(json.dumps(values, indent=1))


def test_resumes_bit_for_bit_after_sigkill_and_sigterm(lane_device, data_root, tmp_path):
    cfg = tiny_config(data_root, device=lane_device, deterministic=True, **OVERRIDES)
    conf, ref, out = _conf(tmp_path, cfg), tmp_path / "ref", tmp_path / "run"
    assert _train(conf, ref) == 0
    assert _train(conf, out, DMLREPRO_TEST_KILL_AFTER_STEPS=5) == -signal.SIGKILL
    assert _train(conf, out, DMLREPRO_TEST_SIGNAL_AFTER_STEPS=2) == EXIT_INTERRUPTED
    assert _train(conf, out) == 0
    _assert_identical(ref, out)


def test_fp16_with_scaler_and_clipping_resumes_after_a_signal(lane_device, data_root, tmp_path):
    cfg = tiny_config(
        data_root,
        device=lane_device,
        deterministic=True,
        amp={"enabled": True, "dtype": "float16"},
        loss={"name": "proxy_anchor"},
        grad_clip={"value": 1.0},
    )
    conf, ref, out = _conf(tmp_path, cfg), tmp_path / "ref", tmp_path / "run"
    assert _train(conf, ref) == 0
    assert _train(conf, out, DMLREPRO_TEST_SIGNAL_AFTER_STEPS=6, DMLREPRO_TEST_SIGNAL="USR2") == EXIT_INTERRUPTED
    state = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    assert state["amp_dtype"] == "float16" and state["scaler"]["scale"] > 0
    assert _train(conf, out) == 0
    _same(ref, out)


def test_bf16_training_evaluates_in_float32_on_every_device(lane_device, data_root, tmp_path):
    cfg = tiny_config(
        data_root, device=lane_device, amp={"enabled": True, "dtype": "bfloat16"}, loss={"name": "proxy_anchor"}
    )
    out = tmp_path / "run"
    assert _train(_conf(tmp_path, cfg), out) == 0
    record = json.loads((out / "metrics.json").read_text())
    assert record["precision"]["train"] == "bfloat16 autocast" and record["precision"]["eval"] == "float32"
    trained = np.load(out / "embeddings_test.npz")["embeddings"]
    assert _low_bits_used(trained)
    # the device that trained reproduces every metric exactly
    (out / "embeddings_test.npz").unlink()
    assert run_cli(["evaluate", str(out)]).returncode == 0
    assert json.loads((out / "metrics.json").read_text())["metrics"] == record["metrics"]
    assert np.array_equal(np.load(out / "embeddings_test.npz")["embeddings"], trained)
    # the CPU agrees within the documented tolerance
    (out / "embeddings_test.npz").unlink()
    assert run_cli(["evaluate", str(out), "--device", "cpu"]).returncode == 0
    on_cpu = json.loads((out / "metrics.json").read_text())["metrics"]
    emb_diff = float(np.abs(np.load(out / "embeddings_test.npz")["embeddings"] - trained).max())
    metric_diff = {k: abs(on_cpu[k] - record["metrics"][k]) for k in record["metrics"]}
    _lane_record(
        "evaluation_cpu_vs_device",
        {"device": lane_device, "max_abs_embedding_difference": emb_diff, "metric_differences": metric_diff},
    )
    assert emb_diff <= EMBEDDING_ATOL and max(metric_diff.values()) <= METRIC_ATOL, (emb_diff, metric_diff)


def test_a_checkpoint_moves_between_devices(lane_device, data_root, tmp_path, capfd):
    for i, (first, then) in enumerate(((lane_device, "cpu"), ("cpu", lane_device))):
        cfg = tiny_config(data_root, device=first)
        out = tmp_path / f"{i}-{first}-{then}"
        assert _train(_conf(tmp_path, cfg, f"{i}.yaml"), out, DMLREPRO_TEST_SIGNAL_AFTER_STEPS=5) == EXIT_INTERRUPTED
        moved = _conf(tmp_path, {**cfg, "device": then}, f"{i}-moved.yaml")  # device is a runtime key
        r = run_cli(["train", moved, str(out), "--no-progress"])
        assert r.returncode == 0, r.stderr
        assert "resuming from" in r.stdout
        record = json.loads((out / "metrics.json").read_text())
        assert record["status"] == "completed" and record["precision"]["device"].startswith(then)


def test_asap_validation_embeds_in_float32_on_the_device(lane_device, synth_root, tmp_path):
    from dmlrepro.evaluation.embeddings_io import load_embeddings

    cfg = asap_config(synth_root, device=lane_device, epochs=8, asap__projection_patience=1)
    out = tmp_path / "run"
    assert _train(_conf(tmp_path, cfg), out) == 0
    log = json.loads((out / "validation_log.json").read_text())
    assert log["alternations"], log["evaluations"]
    saved = sorted((out / "projections").glob("projection-*_val.npz"))
    assert saved and all(_low_bits_used(load_embeddings(p).embeddings) for p in saved)
    assert json.loads((out / "metrics.json").read_text())["precision"]["device"].startswith(lane_device)


def test_knn_on_the_device_equals_the_cpu_backends(lane_device):
    from dmlrepro.evaluation import compute_retrieval

    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, size=(600, 4)).astype(np.float32)  # exact float32 distances, many ties
    y = rng.integers(0, 20, size=600)
    ks = (1, 2, 4, 8, 32)
    on_device = compute_retrieval(torch.from_numpy(x).to(lane_device), y, ks, backend="torch", chunk_size=64)
    assert on_device.info["device"].startswith(lane_device)
    for backend in ("torch", "faiss-cpu"):
        assert compute_retrieval(x, y, ks, backend=backend).metrics == on_device.metrics, backend


def test_tf32_never_reaches_a_search(lane_device):
    """With TF32 allowed (as `speed.tf32: true` leaves training), the search's distances and neighbours
    equal those with TF32 off, bit for bit; the same product in TF32 would change them, and the lane
    records by how much (top-1 neighbours of 2,000 queries; 0 on a device without TF32 units)."""
    from dmlrepro.evaluation import knn_search

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((500, 128)).astype(np.float32)
    x = centres[rng.integers(0, 500, size=8000)] + 0.3 * rng.standard_normal((8000, 128)).astype(np.float32)
    x = torch.nn.functional.normalize(torch.from_numpy(x), dim=1).to(lane_device)
    matmul, before = torch.backends.cuda.matmul, torch.backends.cuda.matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        exact = knn_search(x, 4, distance="cosine", backend="torch")
        exact_top1 = (x[:2000] @ x.T).fill_diagonal_(-2).argmax(dim=1)
        matmul.allow_tf32 = True
        allowed = knn_search(x, 4, distance="cosine", backend="torch")
        tf32_top1 = (x[:2000] @ x.T).fill_diagonal_(-2).argmax(dim=1)
    finally:
        matmul.allow_tf32 = before
    assert np.array_equal(allowed[0], exact[0]) and np.array_equal(allowed[1], exact[1])
    assert np.array_equal(exact[1][:2000, 0], exact_top1.cpu().numpy())
    changed = int((tf32_top1 != exact_top1).sum())
    _lane_record("tf32_search", {"device": lane_device, "queries": 2000, "top1_changed_if_tf32": changed})


def test_a_short_training_learns_on_the_device(lane_device, tmp_path):
    """config/run_example.yaml (Proxy-Anchor, synthetic, 6 epochs x 40 steps) with TF32 on: test R@1
    well above the untrained network's (0.043 -> 0.268 on the CPU, docs/training.md), searched in float32."""
    cfg = yaml.safe_load((REPO / "config" / "run_example.yaml").read_text())
    cfg["dataset"]["root"] = str(tmp_path / "data")
    cfg.update(device=lane_device, speed={**cfg.get("speed", {}), "tf32": True})
    out = tmp_path / "run"
    assert _train(_conf(tmp_path, cfg), out) == 0
    record = json.loads((out / "metrics.json").read_text())
    before, after = record["untrained_metrics"]["recall@1"], record["metrics"]["recall@1"]
    p = record["precision"]
    _lane_record("learning", {"device": lane_device, "untrained_recall@1": before, "recall@1": after, "precision": p})
    assert after >= before + 0.1, (before, after)
    assert (p["matmul_tf32"], p["search"]) == (True, "float32") and p["device"].startswith(lane_device)
