"""Phase marker of tests/faults, active only with DMLREPRO_FAULT_MARKER set (to a file path, or
empty in a job server whose children get the path in their environment).

On PYTHONPATH, every Python process started with it (``dmlrepro train``, the job server and the
children it forks) wraps the training engine's phases right after ``dmlrepro.train.engine`` is
imported, and records in the file (an mmap shared with the test) the phase the process is in
and, with a CLOCK_MONOTONIC timestamp, every change of phase. After a SIGKILL the phase left in
the file is the one the process died in. Recording changes no number: the wrappers call the
engine's functions unchanged.

Layout (little endian): int32 phase, int32 pid, int32 number of events, int32 0; then events of
16 bytes: int32 phase entered, int32 0, float64 time.monotonic().
"""

import importlib.machinery
import mmap
import os
import struct
import sys
import time

ENV = "DMLREPRO_FAULT_MARKER"
#: start: interpreter start-up and the CLI (a served job: the server's child before the job);
#: run: train_run outside the phases below (config checks, run lock, run folder, the epoch loop);
#: setup: Trainer.__init__ (data, model, loss, optimizer); resume: reading the checkpoints;
#: training: an epoch's data loading and optimizer steps (Trainer._train_epoch outside the phases
#: below); evaluation: an evaluation of the test set (Trainer._evaluate); log: train_log.csv;
#: checkpoint: writing a checkpoint or best_model.pt (checkpoint.write_verified: serialising,
#: digest, write, fsync, rename); finish: the final metrics (Trainer._finish_completed);
#: end: train_run has returned
PHASES = ("start", "run", "setup", "resume", "training", "evaluation", "log", "checkpoint", "finish", "end")
HEADER = struct.Struct("<iiii")
EVENT = struct.Struct("<iid")
SIZE = 1 << 20
_open: dict[int, mmap.mmap] = {}  # pid -> this process's marker (a forked child opens its own)


def _marker():
    path = os.environ.get(ENV)
    if not path:
        return None
    mm = _open.get(os.getpid())
    if mm is None:
        fd = os.open(path, os.O_RDWR)
        try:
            mm = _open[os.getpid()] = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        struct.pack_into("<i", mm, 4, os.getpid())
    return mm


def _enter(name):
    """Record that the process is in phase `name` from now; the phase it leaves."""
    mm = _marker()
    if mm is None:
        return None
    code = PHASES.index(name) if isinstance(name, str) else name
    previous, _, count, _ = HEADER.unpack_from(mm, 0)
    struct.pack_into("<i", mm, 0, code)
    if HEADER.size + (count + 1) * EVENT.size <= SIZE:
        EVENT.pack_into(mm, HEADER.size + count * EVENT.size, code, 0, time.monotonic())
        struct.pack_into("<i", mm, 8, count + 1)
    return previous


def _phase(name, fn, after=None):
    def wrapper(*args, **kwargs):
        previous = _enter(name)
        try:
            return fn(*args, **kwargs)
        finally:
            if previous is not None:
                _enter(after or previous)

    return wrapper


def _wrap(engine, checkpoint):
    trainer = engine.Trainer
    engine.train_run = _phase("run", engine.train_run, after="end")
    engine.load_latest = _phase("resume", engine.load_latest)
    trainer.__init__ = _phase("setup", trainer.__init__)
    trainer._train_epoch = _phase("training", trainer._train_epoch)
    trainer._evaluate = _phase("evaluation", trainer._evaluate)
    trainer._write_log = _phase("log", trainer._write_log)
    trainer._finish_completed = _phase("finish", trainer._finish_completed)
    checkpoint.write_verified = _phase("checkpoint", checkpoint.write_verified)  # every checkpoint, best_model.pt


class _Marker:
    """A meta-path finder that wraps the engine's phases right after its module is executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "dmlrepro.train.engine":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _wrap(module, sys.modules["dmlrepro.train.checkpoint"])

        spec.loader.exec_module = exec_module
        return spec


if ENV in os.environ:
    sys.meta_path.insert(0, _Marker())
