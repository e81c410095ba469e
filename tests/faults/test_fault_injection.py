"""Fault injection: SIGKILL training processes at random times, leave half-written files in a
run's folder (the Snakemake controller's kills are test_workflow_faults.py). Each time a rerun
must complete with nothing lost, no corrupt output accepted, and final metrics identical (exact
floats) to an undisturbed run's, on CPU with deterministic settings.

The kills are plain SIGKILLs sent by the test, to a fresh ``dmlrepro train`` process and to a job
of the workflow's job server, at times drawn uniformly inside the training, evaluation and
checkpoint-writing windows of an undisturbed run (its phase marker's timeline, counted from the
change of phase before the window), until each kind of process has died in each of the three
phases; the phase at death is read from the marker, and the test asserts the coverage. The counts
are printed in the "fault injection" section at the end of the pytest session; docs/training.md
reports them. The draws come from ``random.Random(DMLREPRO_FAULT_SEED)`` (default below);
``DMLREPRO_FAULT_TRIES`` caps the kills per kind of process.
"""

from __future__ import annotations

import collections
import csv
import json
import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from dmlrepro.train import list_checkpoints, read_checkpoint
from dmlrepro.train.checkpoint import checkpoint_name

import fault_harness
from ..conftest import state_differences

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SEED = int(os.environ.get("DMLREPRO_FAULT_SEED", "20261121"))
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
        assert np.array_equal(
            np.load(out / "embeddings_test.npz")["embeddings"], np.load(ref / "embeddings_test.npz")["embeddings"]
        )


def assert_identical(out: Path, ref: Path) -> None:
    """A finished run equals the undisturbed one: metrics.json byte for byte (exact floats), the
    log (one row per epoch, except `seconds`), the embeddings, the final weights and optimizer."""
    assert json.loads((out / "metrics.json").read_text())["status"] == "completed"
    assert (out / "metrics.json").read_text() == (ref / "metrics.json").read_text()
    rows = _log_rows(out / "train_log.csv")
    assert [r["epoch"] for r in rows] == [str(e) for e in range(EPOCHS + 1)], "not exactly one row per epoch"
    assert rows == _log_rows(ref / "train_log.csv")
    assert np.array_equal(
        np.load(out / "embeddings_test.npz")["embeddings"], np.load(ref / "embeddings_test.npz")["embeddings"]
    )
    a, b = (read_checkpoint(list_checkpoints(d / "checkpoints")[-1]) for d in (ref, out))
    assert a["position"]["epoch"] == b["position"]["epoch"] == EPOCHS + 1
    for part in ("model", "loss"):
        assert not state_differences(a[part], b[part]), part
    for i, st in a["optimizer"]["state"].items():
        assert all(
            torch.equal(torch.as_tensor(v), torch.as_tensor(b["optimizer"]["state"][i][k])) for k, v in st.items()
        )
    assert not [p.name for p in out.rglob("*.tmp")], "temporaries of killed writes left behind"


# -- a) SIGKILL at random times -------------------------------------------------------------------------
#: the phases every kind of process must be killed in (the marker's names, fault_harness.PHASES)
REQUIRED_PHASES = ("training", "evaluation", "checkpoint")
KINDS = ("cli", "served")
TRIES = int(os.environ.get("DMLREPRO_FAULT_TRIES", "10"))  # kills per kind, at most, until every phase saw one


def draw_kill_time(timelines: list[list[tuple[str, float]]], phase: str, rng: random.Random) -> tuple[int, float]:
    """A moment drawn uniformly inside the windows of ``phase`` of undisturbed runs (their phase
    markers' timelines, one sequence of phases), as (the change of phase before the window,
    seconds after it). A window is where every timeline was in ``phase``, counted from that change
    of phase; each window is weighted by its length."""
    windows = []  # (change of phase before the window, start, end), seconds after that change
    for i, (name, _) in enumerate(timelines[0][1:-1], start=1):
        start = max(t[i][1] - t[i - 1][1] for t in timelines)
        end = min(t[i + 1][1] - t[i - 1][1] for t in timelines)
        if name == phase and end > start:
            windows.append((i - 1, start, end))
    assert windows, f"the undisturbed runs were never in {phase} at the same time"
    at = rng.uniform(0, sum(end - start for _, start, end in windows))
    for anchor, start, end in windows:  # noqa: B007 (the window the loop stops at is the answer)
        if at <= end - start:
            break
        at -= end - start
    return anchor, start + min(at, end - start)


def _start(kind: str, job_server, conf: Path, out: Path, folder: Path, name: str):
    marker = fault_harness.Marker(folder / f"{name}.marker")
    if kind == "cli":
        return fault_harness.start_cli(conf, out, folder / f"{name}.log", marker)
    return job_server.submit(conf, out, folder / f"{name}.log", marker)


def _resume(kind: str, job_server, conf: Path, out: Path, folder: Path, name: str) -> None:
    """Rerun the killed run to its end, as a user (cli) or Snakemake (served: it deletes a rerun job's
    declared outputs first) would."""
    if kind == "served":
        (out / "train_log.csv").unlink(missing_ok=True)
    job = _start(kind, job_server, conf, out, folder, name)
    assert job.wait() == 0, job.log()


def test_sigkill_at_random_times(job_server, run_config, reference_job, reference, tmp_path):
    """``dmlrepro train`` processes (a fresh CLI process, a job of the workflow's job server) are
    SIGKILLed at random times drawn inside the training, evaluation or checkpoint-writing windows
    of an undisturbed run, until each kind of process has died in each of these phases; every
    killed run leaves nothing corrupt, and its rerun equals the undisturbed run."""
    rng = random.Random(SEED)
    undisturbed = _start("served", job_server, run_config, tmp_path / "served", tmp_path, "served")
    assert undisturbed.wait() == 0, undisturbed.log()
    assert_identical(tmp_path / "served", reference)  # a served job trains exactly as the CLI does
    timelines = [reference_job.marker.events(), undisturbed.marker.events()]
    assert [p for p, _ in timelines[1]] == [p for p, _ in timelines[0]], "the two kinds run different phases"

    deaths = {kind: collections.Counter() for kind in KINDS}
    aimed = {kind: collections.Counter() for kind in KINDS}
    missed, late = collections.Counter(), []
    for kind in KINDS:
        for trial in range(TRIES):
            missing = [p for p in REQUIRED_PHASES if not deaths[kind][p]]
            if not missing:
                break
            phase = rng.choice(missing)
            anchor, offset = draw_kill_time(timelines, phase, rng)
            name = f"{kind}{trial}"
            out = tmp_path / name
            job = _start(kind, job_server, run_config, out, tmp_path, name)
            lateness = fault_harness.kill_in_window(job, anchor, offset)
            killed = lateness is not None
            if killed:
                late.append(lateness)
            status = job.wait()
            aimed[kind][phase] += 1
            if killed:
                assert status == -signal.SIGKILL, f"{kind}: the killed process ended with {status}; {job.log()}"
                deaths[kind][job.marker.phase] += 1
                assert_sane(out, reference)
                _resume(kind, job_server, run_config, out, tmp_path, name + "-rerun")
            else:  # the process ended before its kill time
                assert status == 0, job.log()
                missed[kind] += 1
            assert_identical(out, reference)

    fault_harness.SUMMARY.append(
        f"a) SIGKILL at random times (seed {SEED}), drawn inside an undisturbed run's phase windows; "
        + "; ".join(
            f"{kind}: {sum(deaths[kind].values())} kills, aimed at {dict(aimed[kind])}, died in "
            f"{dict(deaths[kind])}, {missed[kind]} ended before their kill time"
            for kind in KINDS
        )
        + (f"; kills sent {1e3 * min(late):.1f}-{1e3 * max(late):.1f} ms after their drawn time" if late else "")
        + "; every rerun identical to the undisturbed run"
    )
    for kind in KINDS:
        missing = [p for p in REQUIRED_PHASES if not deaths[kind][p]]
        assert not missing, (
            f"{kind}: no kill landed in {missing} after {TRIES} kills; phases at death: {dict(deaths[kind])}"
        )


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
    for name in (
        ".metrics.json.k1ll3d.tmp",
        ".train_log.csv.k1ll3d.tmp",
        "checkpoints/.ckpt-e0004-b000000.pt.k1ll3d.tmp",
    ):
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
    child = server.start(
        [str(conf), str(out), "--no-progress"], tmp_path / "manifest.log", {"DMLREPRO_TEST_KILL_AFTER_STEPS": "5"}
    )
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

    fault_harness.SUMMARY.append(
        f"c) half-written / damaged files: {dict(counts)} "
        f"({sum(counts.values())} in all), none accepted, every rerun identical"
    )


def yaml_root(run_config: Path) -> Path:
    import yaml

    return Path(yaml.safe_load(run_config.read_text())["dataset"]["root"])
