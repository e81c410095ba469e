"""Interrupted runs (SIGKILL at several points, SIGKILL inside a checkpoint write, SIGTERM,
a damaged checkpoint) resume to exactly the weights and metrics of an uninterrupted run.

Every run is a fresh `python -m dmlrepro.train.cli train` process on CPU with deterministic
settings; the interruptions use the engine's test-only hooks (environment variables) so that
they land at known optimizer steps. The reference is an uninterrupted run in its own process.
"""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest
import torch
import yaml

from dmlrepro.train import EXIT_INTERRUPTED, list_checkpoints, read_checkpoint
from dmlrepro.train.checkpoint import checkpoint_name

from ..conftest import state_differences
from .conftest import run_cli

pytestmark = pytest.mark.slow

# 3 epochs x 4 steps; m-per-class sampler, augmentation, warm-up, a step schedule and the
# per-epoch test evaluation are all on, so that each of them has to resume correctly.
OVERRIDES = dict(
    dataset__sampler="m_per_class",
    dataset__m=8,
    dataset__hflip=0.5,
    warmup_epochs=1,
    schedule={"name": "step", "step": 2, "gamma": 0.5},
    checkpoint={"keep": 2},
)


def _write_config(tmp_path, cfg) -> str:
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


def _final_state(outdir):
    ckpts = list_checkpoints(outdir / "checkpoints")
    state = read_checkpoint(ckpts[-1])
    assert state["position"]["epoch"] == 4 and state["position"]["batch"] == 0
    return state


def _assert_identical(ref_dir, run_dir):
    a, b = _final_state(ref_dir), _final_state(run_dir)
    for part in ("model", "loss"):
        assert not state_differences(a[part], b[part]), part
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        for k in sa[i]:
            assert torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k])), f"optimizer state {i}.{k}"
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    ma = json.loads((ref_dir / "metrics.json").read_text())
    mb = json.loads((run_dir / "metrics.json").read_text())
    assert ma["status"] == mb["status"] == "completed"
    assert ma["metrics"] == mb["metrics"]
    ea, eb = np.load(ref_dir / "embeddings_test.npz"), np.load(run_dir / "embeddings_test.npz")
    assert np.array_equal(ea["embeddings"], eb["embeddings"])
    # the log (history) is rebuilt from the checkpoint: same losses and test R@1 per epoch
    la = [r.split(",") for r in (ref_dir / "train_log.csv").read_text().splitlines()]
    lb = [r.split(",") for r in (run_dir / "train_log.csv").read_text().splitlines()]
    sec = la[0].index("seconds")
    assert [r[:sec] + r[sec + 1 :] for r in la] == [r[:sec] + r[sec + 1 :] for r in lb]


def _reference_run(tmp, cfg):
    """(cfg, run folder) of an uninterrupted run in its own process."""
    out = tmp / "run"
    res = run_cli(["train", _write_config(tmp, cfg), str(out), "--no-progress"])
    assert res.returncode == 0, res.stderr
    return cfg, out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_root):
    from .conftest import tiny_config

    return _reference_run(tmp_path_factory.mktemp("ref"), tiny_config(data_root, **OVERRIDES))


def test_sigkill_at_several_points_resumes_bit_for_bit(reference, tmp_path):
    cfg, ref = reference
    conf, out = _write_config(tmp_path, cfg), tmp_path / "run"
    # 1st process: 4 steps (epoch 1, checkpoint e2), then killed after step 1 of epoch 2.
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_KILL_AFTER_STEPS": "5"})
    assert r.returncode == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [checkpoint_name(2, 0)]
    # 2nd: resumes at epoch 2 batch 0, finishes epoch 2 (checkpoint e3), killed after step 2 of epoch 3.
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_KILL_AFTER_STEPS": "6"})
    assert r.returncode == -signal.SIGKILL
    assert "resuming from " + checkpoint_name(2, 0) in r.stdout
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [checkpoint_name(2, 0), checkpoint_name(3, 0)]
    # 3rd: killed right after its first step (mid epoch 3 again, nothing new saved).
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_KILL_AFTER_STEPS": "1"})
    assert r.returncode == -signal.SIGKILL
    # the newest checkpoint is damaged (e.g. disk trouble): the run falls back to the older one
    newest = out / "checkpoints" / checkpoint_name(3, 0)
    data = newest.read_bytes()
    newest.write_bytes(data[:-100] + bytes(100))
    r = run_cli(["train", conf, str(out), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "cannot be used" in r.stdout and "resuming from " + checkpoint_name(2, 0) in r.stdout
    assert (out / "checkpoints" / (checkpoint_name(3, 0) + ".corrupt")).exists()
    _assert_identical(ref, out)


def test_sigkill_inside_checkpoint_write_never_loads_half_a_file(reference, tmp_path):
    cfg, ref = reference
    conf, out = _write_config(tmp_path, cfg), tmp_path / "run"
    # killed in the middle of writing the 2nd checkpoint (end of epoch 2): a half-written
    # temporary file is left behind, the epoch-2 checkpoint never appears.
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_KILL_IN_CHECKPOINT": "2"})
    assert r.returncode == -signal.SIGKILL
    ck = out / "checkpoints"
    assert [p.name for p in list_checkpoints(ck)] == [checkpoint_name(2, 0)]
    assert list(ck.glob(".ckpt-*.tmp")), "expected the half-written temporary file"
    r = run_cli(["train", conf, str(out), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert not list(ck.glob(".ckpt-*.tmp"))
    _assert_identical(ref, out)


def test_sigterm_checkpoints_mid_epoch_and_resumes_bit_for_bit(reference, tmp_path):
    cfg, ref = reference
    conf, out = _write_config(tmp_path, cfg), tmp_path / "run"
    # SIGTERM after step 2: the step finishes, a mid-epoch checkpoint (epoch 1, batch 2) is written
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_SIGNAL_AFTER_STEPS": "2"})
    assert r.returncode == EXIT_INTERRUPTED, r.stderr
    assert "SIGTERM" in r.stderr
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [checkpoint_name(1, 2)]
    state = read_checkpoint(out / "checkpoints" / checkpoint_name(1, 2))
    assert state["position"]["global_step"] == 2 and state["position"]["epoch_steps"] == 2
    # resumed at batch 2; a second SIGTERM 5 steps later lands at epoch 2, batch 3
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_SIGNAL_AFTER_STEPS": "5"})
    assert r.returncode == EXIT_INTERRUPTED, r.stderr
    assert "resuming from " + checkpoint_name(1, 2) in r.stdout
    assert list_checkpoints(out / "checkpoints")[-1].name == checkpoint_name(2, 3)
    r = run_cli(["train", conf, str(out), "--no-progress"])
    assert r.returncode == 0, r.stderr
    _assert_identical(ref, out)


def test_uninterrupted_rerun_is_identical_and_finished_run_is_not_retrained(reference, tmp_path):
    """Determinism itself (two fresh processes), and a finished run directory is left alone."""
    cfg, ref = reference
    conf, out = _write_config(tmp_path, cfg), tmp_path / "run"
    assert run_cli(["train", conf, str(out), "--no-progress"]).returncode == 0
    _assert_identical(ref, out)
    before = (out / "metrics.json").read_text()
    r = run_cli(["train", conf, str(out), "--no-progress"])
    assert r.returncode == 0 and "already finished" in r.stdout
    assert (out / "metrics.json").read_text() == before


@pytest.fixture(scope="module")
def dropout_reference(tmp_path_factory, data_root):
    """An uninterrupted run whose steps draw from the global generators (dropout on the trunk's
    pooled features): a resume that does not restore them trains on other dropout masks."""
    from .conftest import tiny_config

    cfg = tiny_config(data_root, model__backbone_kwargs__drop_rate=0.3, **OVERRIDES)
    return _reference_run(tmp_path_factory.mktemp("ref-dropout"), cfg)


def test_resume_restores_the_random_generators(dropout_reference, tmp_path):
    cfg, ref = dropout_reference
    conf, out = _write_config(tmp_path, cfg), tmp_path / "run"
    # SIGTERM after step 2 of epoch 2 (epoch 1 is the warm-up, whose frozen trunk draws nothing)
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_SIGNAL_AFTER_STEPS": "6"})
    assert r.returncode == EXIT_INTERRUPTED, r.stderr
    r = run_cli(["train", conf, str(out), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "resuming from " + checkpoint_name(2, 2) in r.stdout
    _assert_identical(ref, out)
