"""How a run uses its machine: CPUs for the loader (num_workers auto), runtime keys outside the run
id, the fused finiteness check, preemption signals (USR2, workers, submitit's requeue), the run
lock's fallback where flock is unsupported, and CUDA RNG states of more GPUs than are visible."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from dmlrepro.runs import run_id_for
from dmlrepro.train import engine
from dmlrepro.train.config import config_identity, resolve_run_config
from dmlrepro.train.preemption import RunInterrupted, StopFlag
from dmlrepro.train.runlock import lock_file, run_lock
from dmlrepro.train.runtime import available_cpus, resolve_runtime
from dmlrepro.train.state import RunDir
from dmlrepro.train.stepper import all_finite

from .conftest import tiny_config


@pytest.fixture
def cpus(monkeypatch):
    """Pretend this process may run on `n` CPUs (its affinity mask), outside any SLURM job."""
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    return lambda n: monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))


def _resolved(tmp_path, **overrides):
    return resolve_run_config(tiny_config(tmp_path, **overrides))


@pytest.mark.parametrize(
    "affinity, slurm, threads, workers, torch_threads",
    [
        (8, None, None, 7, 1),  # all CPUs of the process but the trainer's own
        (64, "8", None, 7, 1),  # a cluster that does not bind CPUs: the allocation's count caps the mask
        (8, None, 4, 3, 1),  # threads (the workflow's job CPUs) is the budget
        (1, None, None, 0, 1),  # a single CPU: loading in the main process
    ],
)
def test_num_workers_auto_is_the_cpus_of_the_process_less_the_trainer(
    tmp_path, cpus, monkeypatch, affinity, slurm, threads, workers, torch_threads
):
    cpus(affinity)
    if slurm:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", slurm)
    cfg = resolve_runtime(_resolved(tmp_path, num_workers="auto", threads=threads), torch.device("cpu"))
    assert (cfg["num_workers"], cfg["threads"]) == (workers, torch_threads)


def test_explicit_workers_and_threads_are_kept(tmp_path, cpus):
    cpus(8)
    cfg = resolve_runtime(_resolved(tmp_path, num_workers=2, threads=3), torch.device("cpu"))
    assert (cfg["num_workers"], cfg["threads"]) == (2, 3)
    assert available_cpus() == 8


def test_deterministic_auto_is_on_for_the_cpu_and_off_on_cuda(tmp_path):
    cfg = _resolved(tmp_path)
    assert cfg["deterministic"] == "auto"
    assert resolve_runtime(cfg, torch.device("cpu"))["deterministic"] is True
    assert resolve_runtime(cfg, torch.device("cuda"))["deterministic"] is False
    assert resolve_runtime(_resolved(tmp_path, deterministic=True), torch.device("cuda"))["deterministic"] is True


def test_runtime_keys_are_not_part_of_the_run_id(tmp_path):
    base = _resolved(tmp_path)
    fast = _resolved(
        tmp_path,
        num_workers="auto",
        threads=8,
        deterministic=False,
        speed={"cudnn_benchmark": True, "channels_last": True, "tf32": True, "sync_every": 50},
    )
    assert config_identity(base) == config_identity(fast)
    assert run_id_for("m", "d", base) == run_id_for("m", "d", fast)
    assert run_id_for("m", "d", base) != run_id_for("m", "d", _resolved(tmp_path, seed=4))


@pytest.mark.parametrize(
    "key, value",
    [
        ("num_workers", "8"),
        ("num_workers", -1),
        ("deterministic", "yes"),
        ("speed", {"sync_every": 0}),
        ("speed", {"tf32": "on"}),
    ],
)
def test_bad_runtime_values_name_the_key(tmp_path, key, value):
    from dmlrepro.train.config import ConfigError

    with pytest.raises(ConfigError, match=key):
        _resolved(tmp_path, **{key: value})


def test_all_finite_matches_a_per_tensor_check():
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        tensors = [torch.randn(int(n), generator=g) * 1e30 for n in torch.randint(1, 50, (6,), generator=g)]
        if trial % 3:  # an inf or NaN somewhere in two of three trials
            t = tensors[trial % 6]
            t[trial % len(t)] = (float("inf"), float("-inf"), float("nan"))[trial % 3]
        expected = all(bool(torch.isfinite(t).all()) for t in tensors)
        assert bool(all_finite(tensors)) is expected
    big = [torch.full((1000,), 3e38)]  # finite, but its norm overflows: still finite
    assert bool(all_finite(big))


# -- signals ------------------------------------------------------------------------------------


def test_usr2_sets_the_stop_flag():
    with StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGUSR2)
        for _ in range(100):
            if stop:
                break
            time.sleep(0.01)
        assert stop.signum == signal.SIGUSR2


def test_loader_workers_ignore_the_preemption_signals():
    from dmlrepro.train.run_data import worker_init

    sigs = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    old = {s: signal.getsignal(s) for s in sigs}
    try:
        worker_init(0)
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in sigs)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def test_launch_job_hands_usr2_to_submitits_requeue(monkeypatch, tmp_path):
    """On USR2 the run checkpoints (RunInterrupted); then submitit's own handler, installed when the
    job started and back in place, runs: it calls TrainJob.checkpoint and requeues the job."""
    import submitit

    from dmlrepro.train.cli import TrainJob

    def interrupted(signum):
        def train_run(config, outdir, progress):
            raise RunInterrupted(signum, tmp_path / "ckpt")

        return train_run

    seen = []
    old = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))  # stands in for submitit's handler
    try:
        job = TrainJob({}, str(tmp_path))
        monkeypatch.setattr(engine, "train_run", interrupted(signal.SIGTERM))
        with pytest.raises(RunInterrupted):
            job()
        assert seen == []  # SIGTERM: exit 75, the workflow's retry resumes
        monkeypatch.setattr(engine, "train_run", interrupted(signal.SIGUSR2))
        with pytest.raises(RunInterrupted):
            job()
        assert seen == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, old)
    again = job.checkpoint()
    assert isinstance(again, submitit.helpers.DelayedSubmission) and again.function.outdir == str(tmp_path)


# -- the run lock where flock is unsupported -----------------------------------------------------


def _no_flock(monkeypatch, code=errno.ENOLCK):
    import fcntl

    def flock(fd, op):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", flock)


def test_run_lock_falls_back_to_a_lock_file(monkeypatch, tmp_path, capsys):
    _no_flock(monkeypatch)
    lock = RunDir(tmp_path).lock_pid
    with run_lock(tmp_path):
        assert lock.read_text().split() == [str(os.getpid()), socket.gethostname()]
    assert not lock.exists()
    assert "flock is not supported" in capsys.readouterr().out


def test_stale_lock_file_of_a_dead_process_is_taken_over(monkeypatch, tmp_path):
    _no_flock(monkeypatch, errno.EOPNOTSUPP)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = RunDir(tmp_path).lock_pid
    lock.write_text(f"{dead.pid} {socket.gethostname()}\n")
    with run_lock(tmp_path):
        assert lock.read_text().split()[0] == str(os.getpid())


def test_lock_file_of_a_live_process_is_waited_for(tmp_path):
    lock = RunDir(tmp_path).lock_pid
    lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")  # a live holder
    threading.Timer(0.3, lock.unlink).start()
    t0 = time.monotonic()
    with lock_file(lock, poll=0.05):
        assert time.monotonic() - t0 >= 0.3
        assert lock.exists()


def test_other_flock_errors_are_not_hidden(monkeypatch, tmp_path):
    _no_flock(monkeypatch, errno.EIO)
    with pytest.raises(OSError, match="Input/output"):
        with run_lock(tmp_path):
            pass


# -- resume on another machine -------------------------------------------------------------------


def test_cuda_rng_states_of_more_gpus_than_visible(monkeypatch, capsys):
    from dmlrepro.train.seeding import restore_cuda_rng

    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((int(state[0]), device)))
    restore_cuda_rng([torch.tensor([i], dtype=torch.uint8) for i in range(4)])  # saved on a 4-GPU node
    assert restored == [(0, 0), (1, 1)]
    assert "4 GPUs, 2 visible" in capsys.readouterr().out
    restored.clear()
    restore_cuda_rng([torch.tensor([7], dtype=torch.uint8)])  # saved with one GPU, two visible now
    assert restored == [(7, 0)]


def test_pfml_pair_search_auto_by_device_and_memory_budget(monkeypatch):
    """`auto` is dense up to 2^14 pairs a block on the CPU and, on a GPU of 2 GiB (budget 2^28 bytes,
    tests/losses/test_pair_memory_budget.py), up to 2^24 pairs of 16 bytes; both modes give the same
    loss (tests/losses/test_neighbour_list.py)."""
    from dmlrepro.losses import PFMLLoss, potential_field

    monkeypatch.setattr(potential_field, "device_memory", lambda device: 2 * 2**30)
    loss = PFMLLoss(10, 4, 2, delta=0.5)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert not loss._sparse(2**14, 2**14, cpu) and loss._sparse(2**14 + 1, 2**14, cpu)
    assert not loss._sparse(2**24, 2**14, gpu) and loss._sparse(2**24 + 1, 2**14, gpu)
    assert loss._sparse(1, 2**14, gpu) is False
    assert PFMLLoss(10, 4, 2, delta=0.5, pair_search="neighbour")._sparse(1, 2**14, gpu) is True
