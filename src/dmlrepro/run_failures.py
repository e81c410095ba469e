"""Failed runs, recorded so that a report can be built without them (docs/workflow.md#when-runs-fail).

A train or search job records a failed attempt in ``<results>/failed/<run_id>.json``
(``dmlrepro.run_table.ResultsLayout.failure``: the error's last
line from the job's log, the host, the time) when its training raises or exits non-zero, but not when
it was interrupted to be resumed (preemption: ``RunInterrupted``, exit 75); each attempt removes the
record when it starts. With the config key ``skip_failed_runs``, the workflow leaves out the experiments
whose runs failed and the report lists them as not run, with the error: one failed run no longer holds
back every other section. Without it a failed run is retried, as Snakemake does.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dmlrepro.atomic import atomic_write_text

#: the exit status of a run interrupted to be resumed (dmlrepro.train.preemption.EXIT_INTERRUPTED; not
#: imported: the Snakefile imports this module and must not import torch)
EXIT_INTERRUPTED = 75


@contextmanager
def recorded_failure(record: str | os.PathLike, log: str | os.PathLike) -> Iterator[None]:
    """Around a job's training: remove an earlier attempt's ``record``; write one if the training fails."""
    record = Path(record)
    record.unlink(missing_ok=True)
    try:
        yield
    except BaseException as error:
        if not _interrupted(error):
            _write(record, error, Path(log))
        raise


def _interrupted(error: BaseException) -> bool:
    """Stopped to be resumed (a preemption's checkpoint written), or stopped by the user: no failure."""
    if isinstance(error, KeyboardInterrupt) or type(error).__name__ == "RunInterrupted":
        return True
    return isinstance(error, SystemExit) and error.code in (0, None, EXIT_INTERRUPTED)


def _write(record: Path, error: BaseException, log: Path) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "error": last_error_line(log) or _describe(error),
        "log": str(log),
        "host": socket.gethostname(),
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    atomic_write_text(record, json.dumps(entry, indent=1) + "\n")


def _describe(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"exit status {error.code}"
    return f"{type(error).__name__}: {error}".strip()


def last_error_line(log: Path) -> str:
    """The last non-empty line of a job's log (a traceback's exception line), '' without a log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def failed_experiments(table, layout) -> dict[str, str]:
    """Experiment -> why it is left out, for the experiments of ``table`` (a ``dmlrepro.run_table.RunTable``)
    with a run or search whose last attempt failed (a record at ``layout.failure(run_id)``)."""
    reasons = {}
    for experiment in table.experiments:
        for run in [*table.experiment_runs(experiment), *table.experiment_searches(experiment)]:
            found = _failure(Path(layout.failure(run.run_id)), run)
            if found:
                reasons[experiment] = found
                break
    return reasons


def _failure(record: Path, run) -> str:
    if not record.is_file():
        return ""
    entry = json.loads(record.read_text())
    where = f"{run.method} on {run.dataset}, seed {run.seed}"
    return f"run {run.run_id} ({where}) failed: {entry['error']} (log: {entry['log']})"
