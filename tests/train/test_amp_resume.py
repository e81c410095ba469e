"""The code a GPU run takes, on the CPU: autocast (float16 with the GradScaler, bfloat16), a step
skipped on inf gradients, unscaling before clipping, the scaler in checkpoints and a bit-identical
fp16 resume after USR2; host syncs every N steps giving the same run; a checkpoint written on
another device (autocast dtype of amp auto, an empty fp16 scaler state, CUDA RNG states of 4 GPUs)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from dmlrepro.train import EXIT_INTERRUPTED, list_checkpoints, read_checkpoint, train_run
from dmlrepro.train.checkpoint import write_verified

from ..conftest import state_differences
from .conftest import run_cli, tiny_config

pytestmark = pytest.mark.slow

# Proxy-Anchor: PFML's loss values (~1e5 on this config) keep float16 gradients overflowing for many steps
FP16 = dict(amp={"enabled": True, "dtype": "float16"}, loss={"name": "proxy_anchor"})


def _trainer(cfg, outdir):
    from dmlrepro.train.config import resolve_run_config
    from dmlrepro.train.engine import Trainer, _stored_yaml
    from dmlrepro.train.preemption import StopFlag
    from dmlrepro.train.run_data import SeededDataset
    from dmlrepro.train.runtime import resolve_runtime

    c = resolve_runtime(resolve_run_config(cfg), torch.device("cpu"))
    t = Trainer(c, _stored_yaml(c), outdir, False, StopFlag())
    t.parts.sampler.set_epoch(1, 0)
    x, y, _ = next(iter(torch.utils.data.DataLoader(SeededDataset(t.parts.train_ds), batch_sampler=t.parts.sampler)))
    t.open_window()
    return t, x, y


def _weights(t):
    return [p.detach().clone() for p in [*t.parts.model.parameters(), *t.parts.loss.parameters()]]


def test_fp16_step_skips_on_inf_and_clips_unscaled_gradients(data_root, tmp_path):
    clip = 1e-3
    t, x, y = _trainer(tiny_config(data_root, grad_clip={"value": clip}, **FP16), tmp_path)
    assert t.parts.amp_dtype == torch.float16 and t.parts.stepper.scaler.is_enabled()
    for _ in range(10):  # the scaler backs off from 2**16 until the gradients fit float16
        scale = t.parts.stepper.scaler.get_scale()
        t.step(x, y)
        if t.parts.stepper.scaler.get_scale() == scale:
            break
    assert t.parts.stepper.scaler.get_scale() == scale < 2.0**16
    before = _weights(t)
    hook = next(t.parts.model.parameters()).register_hook(lambda g: g * float("inf"))  # force an inf gradient
    t.step(x, y)
    assert t.sync(1, {}) is None  # an overflow is the scaler's business, not a divergence
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(t)))  # step skipped
    assert t.parts.stepper.scaler.get_scale() == scale * 0.5  # backoff
    hook.remove()
    t.step(x, y)
    assert not all(torch.equal(a, b) for a, b in zip(before, _weights(t)))
    # clipped after unscaling: the largest gradient is the clip value itself, not clip / scale
    grads = torch.cat([p.grad.flatten() for p in t.parts.stepper.clip_params if p.grad is not None])
    assert grads.abs().max() == torch.tensor(clip, dtype=grads.dtype)


def test_bf16_autocast_on_the_cpu(data_root, tmp_path):
    t, x, y = _trainer(tiny_config(data_root, amp={"enabled": True, "dtype": "bfloat16"}), tmp_path)
    assert t.parts.amp_dtype == torch.bfloat16 and not t.parts.stepper.scaler.is_enabled()
    with torch.autocast("cpu", dtype=t.parts.amp_dtype):
        assert t.parts.model(x).dtype == torch.bfloat16
    before = _weights(t)
    t.step(x, y)
    assert t.sync(1, {}) is None and not all(torch.equal(a, b) for a, b in zip(before, _weights(t)))


def _write(tmp_path, cfg):
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return str(p)


def _final(outdir):
    state = read_checkpoint(list_checkpoints(outdir / "checkpoints")[-1])
    return state, json.loads((outdir / "metrics.json").read_text())


def _same(a_dir, b_dir):
    (a, ma), (b, mb) = _final(a_dir), _final(b_dir)
    for part in ("model", "loss"):
        assert not state_differences(a[part], b[part]), part
    assert a["scaler"] == b["scaler"]
    assert ma["metrics"] == mb["metrics"]
    strip = lambda d: [r.split(",")[:4] for r in (d / "train_log.csv").read_text().splitlines()]  # noqa: E731
    assert strip(a_dir) == strip(b_dir)  # epoch, phase, steps, loss


def test_fp16_run_resumes_bit_for_bit_after_usr2(data_root, tmp_path):
    conf = _write(tmp_path, tiny_config(data_root, **FP16))
    ref, out = tmp_path / "ref", tmp_path / "run"
    assert run_cli(["train", conf, str(ref), "--no-progress"]).returncode == 0
    r = run_cli(
        ["train", conf, str(out), "--no-progress"],
        {"DMLREPRO_TEST_SIGNAL_AFTER_STEPS": "6", "DMLREPRO_TEST_SIGNAL": "USR2"},
    )
    assert r.returncode == EXIT_INTERRUPTED and "SIGUSR2" in r.stderr, r.stderr
    state = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    assert state["amp_dtype"] == "float16" and 0 < state["scaler"]["scale"] < 2.0**16  # backed off at least once
    assert run_cli(["train", conf, str(out), "--no-progress"]).returncode == 0
    _same(ref, out)


def test_host_sync_every_n_steps_changes_nothing(data_root, tmp_path):
    train_run(tiny_config(data_root), tmp_path / "every1", progress=False)
    train_run(tiny_config(data_root, speed={"sync_every": 3}), tmp_path / "every3", progress=False)
    _same(tmp_path / "every1", tmp_path / "every3")


def test_divergence_found_n_steps_late_is_recorded_at_its_step(data_root, tmp_path):
    from .test_divergence import _exploding

    def tiny(**kw):
        return tiny_config(data_root, **kw)

    a = train_run(_exploding(tiny), tmp_path / "every1", progress=False)
    cfg = _exploding(tiny)
    cfg["speed"] = {"sync_every": 4}
    b = train_run(cfg, tmp_path / "every4", progress=False)
    assert a["status"] == b["status"] == "diverged" and a == b
    strip = lambda d: [r.split(",")[:4] for r in (d / "train_log.csv").read_text().splitlines()]  # noqa: E731
    assert strip(tmp_path / "every1") == strip(tmp_path / "every4")


def test_checkpoint_from_another_device_keeps_its_autocast_dtype(data_root, tmp_path, capsys, monkeypatch):
    """A CUDA run's checkpoint (amp auto = float16 there, an empty scaler state, the RNG of 4 GPUs)
    resumed on the CPU, where amp auto means no autocast: it goes on in float16 and says so."""
    monkeypatch.setenv("DMLREPRO_TEST_SIGNAL_AFTER_STEPS", "5")
    cfg = tiny_config(data_root, amp={"enabled": "auto", "dtype": "float16"})
    out = tmp_path / "run"
    with pytest.raises(Exception, match="SIGTERM"):
        train_run(cfg, out, progress=False)
    monkeypatch.delenv("DMLREPRO_TEST_SIGNAL_AFTER_STEPS")
    [path] = list_checkpoints(out / "checkpoints")[-1:]
    state = read_checkpoint(path)
    assert state["amp_dtype"] is None and state["scaler"] == {}  # the CPU: amp auto is off
    state["amp_dtype"] = "float16"  # as if written on CUDA ...
    state["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8) for _ in range(4)]  # ... with 4 GPUs
    write_verified(path, state)
    capsys.readouterr()
    res = train_run(cfg, out, progress=False)
    assert res["status"] == "completed"
    assert "keeping the checkpoint's autocast dtype float16" in capsys.readouterr().out
    final = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    assert final["amp_dtype"] == "float16" and final["scaler"]["scale"] > 0


def test_speed_options_run_and_are_restored(data_root, tmp_path):
    before = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    speed = {"cudnn_benchmark": True, "channels_last": True, "tf32": True, "sync_every": 2}
    res = train_run(tiny_config(data_root, speed=speed, deterministic=False), tmp_path / "run", progress=False)
    assert res["status"] == "completed"
    used = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert {k: used["speed"][k] for k in speed} == speed and used["deterministic"] is False
    assert (
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    ) == before
