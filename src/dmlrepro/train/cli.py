"""Command-line entry points (wired into ``dmlrepro`` by the package CLI):

    dmlrepro train RUN_CONFIG OUTDIR [--set KEY=VALUE ...] [--no-progress]
    dmlrepro evaluate OUTDIR [--device DEV]
    dmlrepro launch RUN_CONFIG OUTDIR [--executor slurm|local|debug] [--partition P] [--gpus N] ...

Each ``*_main(argv)`` returns the exit code: 0 success (a diverged run is a success: its
metrics.json says ``"status": "diverged"``), 1 runtime error (missing data/weights, ...),
2 bad config or arguments, 75 (``EX_TEMPFAIL``) stopped by SIGTERM/SIGUSR1/SIGUSR2 after writing a
checkpoint (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, load_run_config, resolve_run_config
from .preemption import EXIT_INTERRUPTED, RunInterrupted

log = logging.getLogger(__name__)


def _set(cfg: dict, assignment: str) -> None:
    """Apply ``a.b.c=value`` (value parsed as YAML) to a nested dict."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. optimizer.lr=1e-3")
    key, raw = assignment.split("=", 1)
    node = cfg
    parts = key.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: {p!r} is not a mapping")
    node[parts[-1]] = yaml.safe_load(raw)


def _config(path: str, sets: Sequence[str]) -> dict[str, Any]:
    cfg = load_run_config(path)
    for s in sets or ():
        _set(cfg, s)
    return cfg


def _error(cmd: str, e: BaseException, code: int) -> int:
    print(f"dmlrepro {cmd}: error: {one_line(e)}", file=sys.stderr, flush=True)
    return code


def one_line(e: BaseException) -> str:
    """The error's message on one line. An error raised in a DataLoader worker comes back with the
    worker's traceback as its text ("Original Traceback ..."): its last line is the message."""
    text = str(e).strip()
    if "Original Traceback" in text:
        text = text.splitlines()[-1].split(": ", 1)[-1]
    return " ".join(text.split())


def train_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="dmlrepro train", description="Train one run (resumes if OUTDIR has a checkpoint)."
    )
    p.add_argument("run_config", help="YAML run config (see docs/training.md)")
    p.add_argument("outdir", help="run directory: config.yaml, train_log.csv, metrics.json, checkpoints/")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (YAML value)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    args = p.parse_args(argv)
    from .engine import train_run  # deferred: imports torch

    try:
        cfg = _config(args.run_config, args.set)
        res = train_run(cfg, args.outdir, progress=False if args.no_progress else None)
    except RunInterrupted as e:
        print(f"dmlrepro train: {e}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except (ConfigError, ValueError, TypeError) as e:  # bad config (incl. model/loss settings)
        return _error("train", e, 2)
    except (FileNotFoundError, OSError, RuntimeError, KeyError) as e:
        return _error("train", e, 1)
    print(f"status: {res['status']}", flush=True)
    return 0


def evaluate_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dmlrepro evaluate", description="(Re)compute OUTDIR/metrics.json.")
    p.add_argument("outdir", help="a run directory `dmlrepro train` wrote (its config.yaml and checkpoints)")
    p.add_argument("--device", default=None, help="override the run's device for recomputing embeddings")
    args = p.parse_args(argv)
    from .run_evaluation import evaluate_run  # deferred: imports torch

    try:
        res = evaluate_run(args.outdir, device=args.device)
    except ConfigError as e:
        return _error("evaluate", e, 2)
    except (FileNotFoundError, OSError, RuntimeError, ValueError) as e:
        return _error("evaluate", e, 1)
    m = res.get("metrics") or {}
    print(f"status: {res.get('status')}; " + ", ".join(f"{k} = {v:.4f}" for k, v in m.items()), flush=True)
    return 0


def _submitit_signal() -> int:
    """The signal submitit's job handler checkpoints and requeues on (SIGUSR2 unless configured)."""
    try:
        from submitit import JobEnvironment  # deferred: submitit, only under SLURM

        return JobEnvironment._usr_sig()
    except (ImportError, AttributeError, RuntimeError):  # pragma: no cover - submitit missing or changed
        return signal.SIGUSR2


class TrainJob:
    """A submitit-checkpointable ``train_run`` call: on timeout/preemption submitit calls
    ``checkpoint`` and requeues the same job, which resumes from ``OUTDIR/checkpoints``."""

    def __init__(self, config: dict, outdir: str):
        self.config, self.outdir = config, str(outdir)

    def __call__(self) -> dict:
        from .engine import train_run  # deferred: imports torch

        try:
            return train_run(self.config, self.outdir, progress=False)
        except RunInterrupted as e:
            # the checkpoint is written; on submitit's preemption signal (USR2) its own handler, back
            # in place now, calls `checkpoint` and requeues the job, which resumes from OUTDIR/checkpoints
            if e.signum == _submitit_signal() and callable(signal.getsignal(e.signum)):
                signal.raise_signal(e.signum)
            raise

    def checkpoint(self, *args: Any, **kwargs: Any):
        import submitit  # deferred: submitit, only for `launch`

        return submitit.helpers.DelayedSubmission(TrainJob(self.config, self.outdir))


def launch_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dmlrepro launch", description="Submit one run through submitit (SLURM).")
    p.add_argument("run_config", help="YAML run config (see docs/training.md)")
    p.add_argument("outdir", help="run directory the job writes (as `dmlrepro train OUTDIR`)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (YAML value)")
    p.add_argument(
        "--executor",
        choices=("slurm", "local", "debug", "auto"),
        default="auto",
        help="auto = SLURM if available, else local",
    )
    p.add_argument("--folder", default=None, help="submitit log folder (default OUTDIR/submitit)")
    p.add_argument("--partition", default=None, help="SLURM partition (default: the cluster's)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of the job (default: 1)")
    p.add_argument("--cpus", type=int, default=8, help="CPUs of the job (default: 8)")
    p.add_argument("--mem-gb", type=int, default=32, help="memory of the job in GB (default: 32)")
    p.add_argument("--timeout-min", type=int, default=240, help="the job's time limit in minutes (default: 240)")
    p.add_argument(
        "--max-requeue",
        type=int,
        default=5,
        help="times SLURM requeues the job after its time limit; it resumes from its checkpoint (default: 5)",
    )
    p.add_argument("--wait", action="store_true", help="wait for the job and print its result")
    args = p.parse_args(argv)
    try:
        import submitit  # deferred: submitit, only for `launch`
    except ImportError as e:  # pragma: no cover
        return _error("launch", e, 1)
    try:
        cfg = _config(args.run_config, args.set)
        resolve_run_config(cfg)  # fail here, not in the queue
    except ConfigError as e:
        return _error("launch", e, 2)
    folder = Path(args.folder or Path(args.outdir) / "submitit")
    cluster = None if args.executor == "auto" else args.executor
    ex = submitit.AutoExecutor(folder=folder, cluster=cluster, slurm_max_num_timeout=args.max_requeue)
    params: dict[str, Any] = dict(
        timeout_min=args.timeout_min,
        cpus_per_task=args.cpus,
        mem_gb=args.mem_gb,
        name=f"dmlrepro-{Path(args.outdir).name}",
    )
    if ex.cluster == "slurm":
        params.update(gpus_per_node=args.gpus, slurm_partition=args.partition, slurm_signal_delay_s=120)
    elif ex.cluster == "local":
        params.update(gpus_per_node=args.gpus if args.gpus else 0)
    params = {k: v for k, v in params.items() if v is not None}
    ex.update_parameters(**params)
    job = ex.submit(TrainJob(cfg, args.outdir))
    print(f"submitted job {job.job_id} ({ex.cluster}); logs in {folder}", flush=True)
    if args.wait:
        try:
            res = job.result()
        except Exception as e:
            return _error("launch", e, 1)
        print(f"status: {res['status']}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": train_main, "evaluate": evaluate_main, "launch": launch_main}
    if not argv or argv[0] not in commands:
        print(f"usage: dmlrepro {{{'|'.join(commands)}}} ...", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
