"""Fault injection: SIGKILL training processes at targeted and random points, kill the Snakemake
controller mid-run, leave half-written files in a run's folder. Each time a rerun must
complete with nothing lost, no corrupt output accepted, and final metrics identical (exact
floats) to an undisturbed run's, on CPU with deterministic settings.

The kills land at least once in each phase docs/training.md names (data loading, training
step, evaluation, checkpoint write, log write, finish): the first trials aim at one phase each
(and kill again until one lands there), the others are random; the test asserts the coverage.
The counts of injected faults (and the phase each kill landed in) are printed in the
"fault injection" section at the end of the pytest session; docs/training.md reports them.
Reproducible: the kill points come from ``random.Random(DMLREPRO_FAULT_SEED)`` (default below);
``DMLREPRO_FAULT_TRIALS`` sets the number of random trials (after the targeted ones).
"""

from __future__ import annotations

import collections
import csv
import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fault_harness
from dmlrepro.train import list_checkpoints, read_checkpoint
from dmlrepro.train.checkpoint import checkpoint_name

from .conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SEED = int(os.environ.get("DMLREPRO_FAULT_SEED", "20261121"))
TRIALS = int(os.environ.get("DMLREPRO_FAULT_TRIALS", "10"))
EPOCHS, STEPS = 3, 4


# -- checks ------------------------------------------------------------------------------------------
def _log_rows(path: Path) -> list[dict[str, str]]:
    """train_log.csv by column name, without `seconds` (wall time, the one column that may differ)."""
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(handle)]


def assert_sane(out: Path, ref: Path) -> None:
    """What a killed run leaves behind: nothing corrupt under a final name, nothing that
    disagrees with the undisturbed run."""
    for ck in list_checkpoints(out / "checkpoints"):
        read_checkpoint(ck)  # raises on a truncated / corrupt file
    if (out / "config.yaml").exists():
        assert (out / "config.yaml").read_text() == (ref / "config.yaml").read_text()
    if (out / "train_log.csv").exists():
        got, want = _log_rows(out / "train_log.csv"), _log_rows(ref / "train_log.csv")
        assert got == want[: len(got)], "the log of a killed run is not a prefix of the undisturbed log"
    if (out / "metrics.json").exists():
        assert (out / "metrics.json").read_text() == (ref / "metrics.json").read_text()
    if (out / "embeddings_test.npz").exists():
        assert np.array_equal(np.load(out / "embeddings_test.npz")["embeddings"],
                              np.load(ref / "embeddings_test.npz")["embeddings"])


def assert_identical(out: Path, ref: Path) -> None:
    """A finished run equals the undisturbed one: metrics.json byte for byte (exact floats), the
    log (one row per epoch, except `seconds`), the embeddings, the final weights and optimizer."""
    assert json.loads((out / "metrics.json").read_text())["status"] == "completed"
    assert (out / "metrics.json").read_text() == (ref / "metrics.json").read_text()
    rows = _log_rows(out / "train_log.csv")
    assert [r["epoch"] for r in rows] == [str(e) for e in range(EPOCHS + 1)], "not exactly one row per epoch"
    assert rows == _log_rows(ref / "train_log.csv")
    assert np.array_equal(np.load(out / "embeddings_test.npz")["embeddings"],
                          np.load(ref / "embeddings_test.npz")["embeddings"])
    a, b = (read_checkpoint(list_checkpoints(d / "checkpoints")[-1]) for d in (ref, out))
    assert a["position"]["epoch"] == b["position"]["epoch"] == EPOCHS + 1
    for part in ("model", "loss"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    for i, st in a["optimizer"]["state"].items():
        assert all(torch.equal(torch.as_tensor(v), torch.as_tensor(b["optimizer"]["state"][i][k])) for k, v in st.items())
    assert not [p.name for p in out.rglob("*.tmp")], "temporaries of killed writes left behind"


# -- a) SIGKILL at targeted and random points ----------------------------------------------------------
#: the phases docs/training.md names (fault_harness.PHASES): data loading, training step, evaluation,
#: checkpoint write, log write, finish; each must see at least one kill
REQUIRED_PHASES = ("data", "step", "evaluate", "checkpoint", "log", "finish")
#: kill trigger -> the phase it aims at: "steps" dies right after the k-th optimizer step (in the
#: epoch loop, i.e. data loading), "ckpt-write" half-way through writing the k-th checkpoint, the
#: others as soon as the process enters the phase; "wall" at a random moment
TARGETS = {"steps": "data", "step": "step", "evaluate": "evaluate", "ckpt-write": "checkpoint", "log": "log",
           "finish": "finish", "checkpoint": "checkpoint", "wall": None}
TARGETED = ("steps", "step", "evaluate", "ckpt-write", "log", "finish")  # the first trials, one per phase
RANDOM_KINDS = ("wall", "steps", "evaluate", "ckpt-write", "checkpoint", "wall", "finish", "step", "log", "wall")
ATTEMPTS = 4  # kills per targeted trial until one lands in its phase


def _kill_once(server, conf: Path, out: Path, log: Path, kind: str, rng: random.Random, full_s: float,
               jitter: bool = True) -> dict:
    argv = ["train", str(conf), str(out), "--no-progress"][1:]
    env = {}
    if kind == "steps":
        env["DMLREPRO_TEST_KILL_AFTER_STEPS"] = str(rng.randint(1, EPOCHS * STEPS))
    elif kind == "ckpt-write":
        env["DMLREPRO_TEST_KILL_IN_CHECKPOINT"] = str(rng.randint(1, EPOCHS))
    child = server.start(argv, log, env)
    if kind == "wall":
        delay = rng.uniform(0, full_s)
        while child.alive() and time.perf_counter() - child.started < delay:
            time.sleep(0.002)
        child.kill()
    elif kind in ("step", "evaluate", "checkpoint", "log", "finish"):
        extra = rng.uniform(0, 0.3) if kind == "evaluate" and jitter else 0.0
        if fault_harness.wait_for_phase(child, [kind]):
            time.sleep(extra)
            child.kill()
    status = child.wait()
    return {"kind": kind, "env": env, "status": status, "phase": child.phase if status == -signal.SIGKILL else None}


def test_sigkill_at_random_points(server, run_config, reference, tmp_path):
    rng = random.Random(SEED)
    # an undisturbed forked run: equals the fresh-process reference, and gives the time scale
    first = server.start([str(run_config), str(tmp_path / "undisturbed"), "--no-progress"], tmp_path / "undisturbed.log")
    assert first.wait() == 0, first.log()
    full_s = first.seconds
    assert_identical(tmp_path / "undisturbed", reference)

    landed, missed, phases, by_kind, reruns = 0, 0, collections.Counter(), collections.Counter(), 0
    for trial in range(len(TARGETED) + TRIALS):
        out, log = tmp_path / f"trial{trial:02d}", tmp_path / f"trial{trial:02d}.log"
        if trial < len(TARGETED):  # aimed at one phase: kill again (the run resumes) until it lands there
            kinds, target = [TARGETED[trial]] * ATTEMPTS, TARGETS[TARGETED[trial]]
        else:
            kinds, target = [RANDOM_KINDS[(trial - len(TARGETED)) % len(RANDOM_KINDS)]] + (
                [rng.choice(RANDOM_KINDS)] if rng.random() < 0.5 else []), None
        for kind in kinds:
            res = _kill_once(server, run_config, out, log, kind, rng, full_s, jitter=target is None)
            if res["status"] == -signal.SIGKILL:
                landed += 1
                phases[res["phase"]] += 1
                by_kind[kind] += 1
                assert_sane(out, reference)
            else:  # the run finished before the kill point
                assert res["status"] == 0, Path(log).read_text()
                missed += 1
            if target is not None and res["phase"] == target:
                break
        done = server.start([str(run_config), str(out), "--no-progress"], log)
        assert done.wait() == 0, done.log()
        reruns += 1
        assert_identical(out, reference)

    # one more: a real `python -m dmlrepro.train.cli train` process killed at a random moment
    # once its run has started (config.yaml written), then resumed by a fresh process
    out = tmp_path / "cli"
    proc = run_cli(["train", str(run_config), str(out), "--no-progress"], popen=True)
    while proc.poll() is None and not (out / "config.yaml").exists():
        time.sleep(0.01)
    time.sleep(rng.uniform(0, 0.3 * full_s))
    assert proc.poll() is None, "the CLI run ended before its kill point"
    proc.send_signal(signal.SIGKILL)
    rc = proc.wait()
    assert rc == -signal.SIGKILL, f"the killed CLI process ended with {rc}, not by SIGKILL"
    assert_sane(out, reference)
    (out / "train_log.csv").unlink(missing_ok=True)  # as Snakemake does with a rerun job's declared outputs
    done = server.start([str(run_config), str(out), "--no-progress"], tmp_path / "cli.log")
    assert done.wait() == 0, done.log()
    assert_identical(out, reference)

    assert landed >= 10
    missing = [p for p in REQUIRED_PHASES if not phases[p]]
    assert not missing, f"no kill landed in {missing}; phases at death: {dict(phases)}"
    fault_harness.SUMMARY.append(
        f"a) {len(TARGETED)} trials aimed at one phase each and {TRIALS} random ones (seed {SEED}): {landed} SIGKILLs landed ({missed} kill points came after the "
        f"run had finished); by trigger: {dict(by_kind)}; phase at death: {dict(phases)}; "
        f"+1 real CLI process killed (rc {rc}, its train_log.csv deleted before the rerun); {reruns + 1} reruns, all identical to the undisturbed run; "
        f"undisturbed run {full_s:.1f} s")


# -- c) half-written files in a run's folder ------------------------------------------------------------
def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_half_written_files_are_not_accepted(server, run_config, reference, tmp_path):
    counts = collections.Counter()

    def train(out, env=None):
        child = server.start([str(run_config), str(out), "--no-progress"], tmp_path / f"{out.name}.log", env)
        return child.wait(), child.log()

    # 1. a finished run whose metrics.json was cut in half (a non-atomic writer that crashed)
    out = tmp_path / "metrics"
    assert train(out)[0] == 0
    _truncate(out / "metrics.json")
    rc, log = train(out)
    assert rc == 0 and "metrics.json is incomplete or damaged" in log, log
    assert_identical(out, reference)
    counts["truncated metrics.json"] += 1
    # ... and one whose metrics.json is valid JSON but not a finished record
    (out / "metrics.json").write_text('{"status": "completed"}\n')
    rc, log = train(out)
    assert rc == 0 and "no metrics" in log, log
    assert_identical(out, reference)
    counts["metrics.json without metrics"] += 1

    # 2. the newest checkpoint truncated in place (mid epoch 3): refused, renamed *.corrupt, the
    #    older one is used; then every checkpoint truncated: the run restarts from scratch
    out = tmp_path / "ckpt"
    assert train(out, {"DMLREPRO_TEST_KILL_AFTER_STEPS": "10"})[0] == -signal.SIGKILL
    ck = out / "checkpoints"
    assert [p.name for p in list_checkpoints(ck)] == [checkpoint_name(2, 0), checkpoint_name(3, 0)]
    _truncate(ck / checkpoint_name(3, 0))
    assert train(out, {"DMLREPRO_TEST_KILL_AFTER_STEPS": "2"})[0] == -signal.SIGKILL
    assert (ck / (checkpoint_name(3, 0) + ".corrupt")).exists()
    for p in list_checkpoints(ck):
        _truncate(p, 0.9)
    rc, log = train(out)
    assert rc == 0 and "cannot be used" in log and "restarting the run from scratch" in log, log
    assert_identical(out, reference)
    counts["truncated checkpoints"] += 3

    # 3. half-written temporaries of every kind of atomic write, and a truncated embeddings file
    #    of a run killed after its final evaluation: ignored / removed / computed again
    out = tmp_path / "emb"
    assert train(out)[0] == 0
    (out / "metrics.json").unlink()
    _truncate(out / "embeddings_test.npz")
    for name in (".metrics.json.k1ll3d.tmp", ".train_log.csv.k1ll3d.tmp", "checkpoints/.ckpt-e0004-b000000.pt.k1ll3d.tmp"):
        (out / name).write_bytes(b"half")
    rc, log = train(out)
    assert rc == 0 and "embeddings_test.npz is missing or damaged" in log, log
    assert_identical(out, reference)
    counts["truncated embeddings_test.npz"] += 1
    counts["half-written temporaries"] += 3

    # 4. a damaged config.yaml: unparsable -> rewritten; cut at a line end -> refused, naming a key
    out = tmp_path / "config"
    assert train(out, {"DMLREPRO_TEST_KILL_AFTER_STEPS": "6"})[0] == -signal.SIGKILL
    text = (out / "config.yaml").read_text()
    # an unclosed flow sequence at column 0 (indented, it could continue a plain scalar and parse)
    (out / "config.yaml").write_text(text[: text.index("\n", len(text) // 2)] + "\n[unclosed")
    assert train(out, {"DMLREPRO_TEST_KILL_AFTER_STEPS": "1"})[0] == -signal.SIGKILL
    (out / "config.yaml").write_text(text[: text.index("\n", len(text) // 2) + 1])
    rc, log = train(out)
    assert rc == 2 and "holds a run with a different config" in log, log
    (out / "config.yaml").unlink()  # what the message tells the user to do, then resume
    rc, log = train(out)
    assert rc == 0 and "resuming from" in log, log
    assert_identical(out, reference)
    counts["damaged config.yaml"] += 2

    # 5. a manifest.csv cut at a line end (it still parses): refused, naming the file; prepared
    #    again (deleted -> the embedded dataset is regenerated), the run resumes to the same result
    import shutil

    root = tmp_path / "data"
    shutil.copytree(yaml_root(run_config), root)
    conf = tmp_path / "run.yaml"
    conf.write_text(run_config.read_text().replace(str(yaml_root(run_config)), str(root)))
    out = tmp_path / "manifest"
    child = server.start([str(conf), str(out), "--no-progress"], tmp_path / "manifest.log",
                         {"DMLREPRO_TEST_KILL_AFTER_STEPS": "5"})
    assert child.wait() == -signal.SIGKILL
    manifest = root / "digits" / "manifest.csv"
    text = manifest.read_text()
    manifest.write_text(text[: text.index("\n", len(text) // 2) + 1])
    child = server.start([str(conf), str(out), "--no-progress"], tmp_path / "manifest.log")
    assert child.wait() == 1
    assert "manifest.csv does not match" in child.log() and "truncated" in child.log()
    manifest.unlink()
    child = server.start([str(conf), str(out), "--no-progress"], tmp_path / "manifest.log")
    assert child.wait() == 0, child.log()
    assert manifest.read_text() == text
    assert_identical(out, reference)
    counts["truncated manifest.csv"] += 1

    fault_harness.SUMMARY.append(f"c) half-written / damaged files: {dict(counts)} "
                                 f"({sum(counts.values())} in all), none accepted, every rerun identical")


def yaml_root(run_config: Path) -> Path:
    import yaml

    return Path(yaml.safe_load(run_config.read_text())["dataset"]["root"])
