"""followup.trigger: plateau (RSW App. D, the reality check: "a normal phase trained until validation
accuracy plateaus, then a followup phase with lower lr(s) and the followup parameter values, again
until validation plateaus"): the switch epoch, the phase-2 lrs and loss attributes, the second
stop, the phase-2 cap, the resume, the config errors and the run identity of the default trigger.

Tiny synthetic dataset (32 classes x 12 images, 16 training classes, one fold validates on 4),
the 3-layer CNN, 3 steps per epoch: a run takes a few seconds.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import math

import numpy as np
import pytest

from dmlrepro.train import ConfigError, RunInterrupted, list_checkpoints, read_checkpoint, resolve_run_config, train_run

from ..conftest import state_differences
from .conftest import SYNTH, with_overrides

E = 3  # steps per epoch = steps per evaluation
LR, FOLLOWUP_LR, HEAD_MULT = 5e-3, 1e-3, 0.5
MARGIN, FOLLOWUP_MARGIN = 0.5, 0.3
PATIENCE, MIN_DELTA = 3, 1e-3


def plateau_config(root, **overrides) -> dict:
    cfg = {
        "dataset": {
            "name": "synthetic",
            "root": str(root),
            "params": dict(SYNTH),
            "sampler": "m_per_class",
            "m": 4,
            "batch_size": 32,
            "image_size": 32,
            "resize": 32,
            "train_crop": "random",
            "eval_batch_size": 512,
        },
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [16, 32, 32], "strides": [2, 2, 2]},
            "embedding_size": 16,
        },
        "loss": {"name": "contrastive", "hparams": {"pos_margin": 0.0, "neg_margin": MARGIN}},
        "optimizer": {"name": "adam", "lr": LR},
        "followup": {
            "epochs": 0,
            "lr": FOLLOWUP_LR,
            "lr_mult": {"head": HEAD_MULT},
            "loss": {"neg_margin": FOLLOWUP_MARGIN},
            "trigger": "plateau",
        },
        "validation": {"split": "fold", "fold": 1, "n_folds": 4, "patience": PATIENCE, "min_delta": MIN_DELTA},
        "eval": {"select": "last", "every": 0, "before_training": False},
        "checkpoint": {"keep": 100},
        "steps_per_epoch": E,
        "epochs": 30,
        "seed": 0,
        "threads": 1,
        "device": "cpu",  # CPU-exact values; the CUDA lane is tests/cuda
    }
    return with_overrides(cfg, overrides)


def _train_recording(cfg, out):
    """train_run, recording (epoch, loss.neg_margin) as each epoch starts training."""
    from dmlrepro.train.parts import RunParts

    seen = []
    original = RunParts.apply_epoch_settings

    def record(self, epoch, followup_start=None):
        lrs = original(self, epoch, followup_start)
        seen.append((epoch, self.loss.neg_margin))
        return lrs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunParts, "apply_epoch_settings", record)
        metrics = train_run(cfg, out, progress=False)
    return metrics, seen


def _read(out):
    with open(out / "train_log.csv") as f:
        rows = list(csv.DictReader(f))
    return rows, json.loads((out / "validation_log.json").read_text()), json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def plateau_run(synth_root, tmp_path_factory):
    cfg = plateau_config(synth_root)
    out = tmp_path_factory.mktemp("plateau") / "run"
    metrics, seen = _train_recording(cfg, out)
    assert metrics["status"] == "completed"
    return cfg, out, seen


def _expected_phases(values: list[float], patience: int, min_delta: float) -> tuple[int, int, list[int], float]:
    """(evaluation after which phase 2 starts, evaluation that stops the run, the improving
    evaluations, the best value), 1-based, from the validation values alone: patience evaluations
    without improving on the best so far end phase 1; the count starts again, the best is kept; the
    next time it reaches patience the run stops."""
    best, bad, switch, improved = -math.inf, 0, 0, []
    for i, v in enumerate(values, 1):
        if v > best + min_delta:
            best, bad = v, 0
            improved.append(i)
        else:
            bad += 1
        if bad >= patience:
            if switch:
                return switch, i, improved, best
            switch, bad = i, 0
    return switch, 0, improved, best


# -- the switch and the second stop ---------------------------------------------------------------------
@pytest.mark.slow
def test_phase_2_starts_after_patience_runs_out_and_the_run_stops_after_patience_again(plateau_run):
    cfg, out, _ = plateau_run
    rows, log, m = _read(out)
    values = [e["map_r"] for e in log["evaluations"]]
    switch, stop, improved, best = _expected_phases(values, PATIENCE, MIN_DELTA)
    assert switch and stop, f"the run did not plateau twice within {cfg['epochs']} epochs: {values}"
    assert stop - switch >= PATIENCE  # the count started again at the switch
    # this run's phase 2 improves on phase 1's best (so phase 2 is longer than the patience)
    assert any(i > switch for i in improved), values
    assert [e["evaluation"] for e in log["evaluations"] if e["improved_global"]] == improved
    assert len(values) == stop < cfg["epochs"]  # no evaluation after the second stop
    assert [int(r["epoch"]) for r in rows] == list(range(1, stop + 1))
    assert [int(r["phase"]) for r in rows] == [1] * switch + [2] * (stop - switch)
    assert [float(r["val_map@r"]) for r in rows] == pytest.approx(values, abs=0)
    assert m["followup_start_epoch"] == switch + 1 and m["stopped_epoch"] == stop and m["epoch"] == stop
    assert m["global_steps"] == E * stop
    assert m["validation"]["early_stopped"] is True and m["validation"]["evaluations"] == stop
    # the log: the switching evaluation is no stop, the last one is; one record per phase
    assert [e["stop"] for e in log["evaluations"]] == [False] * (stop - 1) + [True]
    assert [e.get("restart") for e in log["evaluations"]] == [None] * (switch - 1) + ["followup"] + [None] * (
        stop - switch
    )
    assert [(p["start_step"], p["end_step"], p["end_reason"]) for p in log["projections"]] == [
        (0, E * switch, "followup"),
        (E * switch, E * stop, "early_stop"),
    ]
    # the global best spans both phases
    assert m["validation"]["best"] == best and m["validation"]["best_step"] == E * improved[-1]
    last = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])["position"]
    assert last["epoch"] == stop + 1 and last["followup_start"] == switch + 1 and last["stopped"] == stop


@pytest.mark.slow
def test_phase_2_takes_the_followup_lrs_and_loss_attributes(plateau_run):
    _, out, seen = plateau_run
    rows, _, m = _read(out)
    start = m["followup_start_epoch"]
    for r in rows:
        phase2 = int(r["epoch"]) >= start
        assert float(r["lr_backbone"]) == (FOLLOWUP_LR if phase2 else LR)
        assert float(r["lr_head"]) == (FOLLOWUP_LR * HEAD_MULT if phase2 else LR)
    assert seen == [(e, FOLLOWUP_MARGIN if e >= start else MARGIN) for e in range(1, len(rows) + 1)]


def test_group_lrs_is_a_pure_function_of_the_switch_epoch(synth_root):
    from dmlrepro.train.optim import group_lrs, in_followup

    cfg = resolve_run_config(plateau_config(synth_root, epochs=10))
    phase1 = {"backbone": LR, "head": LR, "loss": LR}
    phase2 = {"backbone": FOLLOWUP_LR, "head": FOLLOWUP_LR * HEAD_MULT, "loss": FOLLOWUP_LR}
    assert [group_lrs(cfg, e) for e in range(1, 11)] == [phase1] * 10  # no switch yet
    assert [group_lrs(cfg, e, 4) for e in range(1, 11)] == [phase1] * 3 + [phase2] * 7
    assert [in_followup(cfg, e, 7) for e in range(1, 11)] == [False] * 6 + [True] * 4
    # the epochs trigger ignores the switch epoch: the last followup.epochs epochs
    fixed = resolve_run_config(
        plateau_config(synth_root, epochs=10, followup__trigger="epochs", followup__epochs=2, validation__patience=None)
    )
    assert [in_followup(fixed, e, 3) for e in range(1, 11)] == [False] * 8 + [True] * 2
    assert group_lrs(fixed, 8, 3) == phase1 and group_lrs(fixed, 9) == phase2


@pytest.mark.slow
def test_followup_epochs_caps_phase_2(plateau_run, synth_root, tmp_path):
    _, ref, _ = plateau_run
    start = _read(ref)[2]["followup_start_epoch"]
    cfg = plateau_config(synth_root, followup__epochs=2)
    m = train_run(cfg, tmp_path / "run", progress=False)
    rows, log, _ = _read(tmp_path / "run")
    assert m["followup_start_epoch"] == start and m["stopped_epoch"] == start + 1
    assert [int(r["phase"]) for r in rows] == [1] * (start - 1) + [2, 2]
    assert m["validation"]["early_stopped"] is False
    assert [p["end_reason"] for p in log["projections"]] == ["followup", "followup_epochs"]


@pytest.mark.slow
def test_the_epochs_cap_in_phase_1_leaves_no_phase_2(plateau_run, synth_root, tmp_path):
    _, ref, _ = plateau_run
    start = _read(ref)[2]["followup_start_epoch"]
    # patience runs out at the last epoch: the run ends there (no phase 2 of zero epochs)
    m = train_run(plateau_config(synth_root, epochs=start - 1), tmp_path / "run", progress=False)
    rows, log, _ = _read(tmp_path / "run")
    assert [int(r["phase"]) for r in rows] == [1] * (start - 1)
    assert m["followup_start_epoch"] is None and m["stopped_epoch"] == start - 1
    assert [p["end_reason"] for p in log["projections"]] == ["early_stop"]


# -- resume ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_interrupted_plateau_run_resumes_to_the_same_result(plateau_run, synth_root, tmp_path, monkeypatch):
    cfg, ref, _ = plateau_run
    start = _read(ref)[2]["followup_start_epoch"]
    switch_step = E * (start - 1)  # the last step of the epoch after which phase 2 starts
    out = tmp_path / "run"
    done = 0
    # SIGTERM (in this process: exit via RunInterrupted with a checkpoint) mid phase 1; right after
    # the last step of the switching epoch (its checkpoint is written before that epoch's validation,
    # so the resumed run validates and switches); one step into phase 2 (the checkpoint holds the
    # switch); then finish
    for stop_at in (4, switch_step, switch_step + 1):
        monkeypatch.setenv("DMLREPRO_TEST_SIGNAL_AFTER_STEPS", str(stop_at - done))
        with pytest.raises(RunInterrupted):
            train_run(cfg, out, progress=False)
        state = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])
        assert state["position"]["global_step"] == stop_at
        assert ("followup_start" in state["position"]) == (stop_at > switch_step)
        done = stop_at
    monkeypatch.delenv("DMLREPRO_TEST_SIGNAL_AFTER_STEPS")
    train_run(cfg, out, progress=False)
    a, b = (read_checkpoint(list_checkpoints(d / "checkpoints")[-1]) for d in (ref, out))
    assert a["position"]["followup_start"] == b["position"]["followup_start"] == start
    for part in ("model", "loss"):
        assert a[part].keys() == b[part].keys()
        assert not state_differences(a[part], b[part]), part
    assert a["validation"] == b["validation"]
    (ra, la, ma), (rb, lb, mb) = _read(ref), _read(out)
    for r in (*ra, *rb):
        r.pop("seconds")
    assert ra == rb and la == lb and ma == mb
    ea, eb = (np.load(d / "embeddings_test.npz") for d in (ref, out))
    assert np.array_equal(ea["embeddings"], eb["embeddings"])


# -- config -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, key, match",
    [
        (dict(validation={"split": None}), "followup.trigger", "validation.split"),
        (dict(validation__patience=None), "followup.trigger", "validation.patience"),
        (dict(followup__trigger="plateaus"), "followup.trigger", "one of"),
        (dict(followup__epochs=30), "followup.epochs", "cap on phase 2"),
        (dict(followup__epochs=-1), "followup.epochs", ">= 0"),
    ],
)
def test_config_errors_name_the_key(tmp_path, overrides, key, match):
    with pytest.raises(ConfigError, match=rf"{key.replace('.', chr(92) + '.')} = .*{match}"):
        resolve_run_config(plateau_config(tmp_path, **overrides))


def test_plateau_with_asap_is_refused(tmp_path):
    cfg = plateau_config(
        tmp_path,
        loss={"name": "asap_c2", "hparams": {"proxies_per_class": 2}},
        followup={"trigger": "plateau", "loss": {}},
        asap={"enabled": True},
    )
    with pytest.raises(ConfigError, match=r"followup\.trigger = 'plateau'.*asap\.enabled"):
        resolve_run_config(cfg)


def test_followup_loss_needs_no_epochs_with_plateau(tmp_path):
    cfg = resolve_run_config(plateau_config(tmp_path))
    assert cfg["followup"] == {
        "epochs": 0,
        "loss": {"neg_margin": FOLLOWUP_MARGIN},
        "lr": FOLLOWUP_LR,
        "lr_mult": {"head": HEAD_MULT},
        "trigger": "plateau",
    }
    with pytest.raises(ConfigError, match=r"followup\.epochs = 0.*followup\.loss"):
        resolve_run_config(plateau_config(tmp_path, followup__trigger="epochs"))


def test_the_default_trigger_leaves_run_ids_unchanged(tmp_path):
    from dmlrepro.runs import config_hash
    from dmlrepro.train.config import config_identity, without_late_defaults

    fixed = plateau_config(
        tmp_path,
        followup={"epochs": 3, "lr": 0.005, "lr_mult": {"head": 0.5}, "loss": {"neg_margin": 0.3}},
        optimizer={"name": "adam", "lr": 0.05, "lr_mult": {"loss": 10.0}},
        validation__patience=2,
        validation__min_delta=0.01,
        epochs=20,
    )
    fixed.pop("checkpoint")
    resolved = resolve_run_config(fixed)
    assert resolved["followup"]["trigger"] == "epochs"
    # computed before followup.trigger existed, when `deterministic: true` was still part of a run's
    # identity (it is a runtime key now: every run id changed with it, and only with it) and
    # `amp.enabled` defaulted to `auto` (every run id changed with its default, docs/readings/protocols.md#proto-r9)
    identity = {**config_identity(resolved), "deterministic": True, "amp": {**resolved["amp"], "enabled": "auto"}}
    old = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str).encode())
    assert old.hexdigest()[:10] == "542c956e6f"
    assert config_hash(resolved) == "19958bde24"  # the id since amp.enabled defaults to false
    for ident in (without_late_defaults(resolved), config_identity(resolved)):
        assert "trigger" not in ident["followup"]
    explicit = copy.deepcopy(fixed)
    explicit["followup"]["trigger"] = "epochs"
    assert config_hash(resolve_run_config(explicit)) == "19958bde24"
    plateau = copy.deepcopy(fixed)
    plateau["followup"]["trigger"] = "plateau"
    assert config_hash(resolve_run_config(plateau)) != "19958bde24"
    assert config_identity(resolve_run_config(plateau))["followup"]["trigger"] == "plateau"


def test_schedule_restart_keeps_the_best_and_counts_patience_again():
    from dmlrepro.asap import AlternationSchedule

    s = AlternationSchedule(eval_every=1, global_patience=2, lam=0.0, alternate=False, min_delta=0.0)
    with pytest.raises(RuntimeError, match="no global stop"):
        s.restart(0)
    for step, v in enumerate([0.5, 0.4, 0.45], 1):
        decision = s.observe(step, v)
    assert decision.stop and s.stopped
    s.restart(3)
    assert not s.stopped and s.best_global == 0.5 and s.bad_global == 0
    assert s.evaluations[-1]["stop"] is False and s.evaluations[-1]["restart"] == "followup"
    assert not s.observe(4, 0.49).stop  # no improvement on the kept best: one bad evaluation
    assert s.observe(5, 0.48).stop  # two: stop again
    assert [p["end_reason"] for p in s.projections] == ["followup", "early_stop"]
    assert [(p["start_step"], p["end_step"], p["best_map_r"]) for p in s.projections] == [(0, 3, 0.5), (3, 5, 0.49)]
    with pytest.raises(RuntimeError, match="no global stop at step 4"):
        s.restart(4)
