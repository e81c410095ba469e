"""Preemption signals: SIGTERM / SIGUSR1 / SIGUSR2 ask the run to stop at the next step boundary
(SIGUSR2 is submitit's preemption and timeout signal; ``dmlrepro launch`` then requeues the job).

The handler only sets a flag; the engine finishes the current optimizer step, writes a
mid-epoch checkpoint and raises :class:`RunInterrupted`; the CLI turns that into exit code
:data:`EXIT_INTERRUPTED` (75, ``EX_TEMPFAIL``) so that SLURM / Snakemake retry the job, which
resumes from the checkpoint.

Test-only hooks (environment variables, read by the engine): ``DMLREPRO_TEST_KILL_AFTER_STEPS=k``
SIGKILLs the process right after its k-th optimizer step, ``DMLREPRO_TEST_SIGNAL_AFTER_STEPS=k``
sends it SIGTERM then, or the signal named by ``DMLREPRO_TEST_SIGNAL=USR2`` (counted per process,
so a resumed run counts from 0 again).
"""

from __future__ import annotations

import os
import signal
import threading

EXIT_INTERRUPTED = 75
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
ENV_KILL_AFTER = "DMLREPRO_TEST_KILL_AFTER_STEPS"
ENV_SIGNAL_AFTER = "DMLREPRO_TEST_SIGNAL_AFTER_STEPS"
ENV_SIGNAL = "DMLREPRO_TEST_SIGNAL"


class RunInterrupted(Exception):
    """Training stopped on a signal after writing a checkpoint; rerun to resume."""

    def __init__(self, signum: int, checkpoint):
        self.signum, self.checkpoint = signum, checkpoint
        super().__init__(
            f"stopped on {signal.Signals(signum).name}; checkpoint {checkpoint}; run the same command again to resume"
        )


class StopFlag:
    """Installs the handlers in ``__enter__`` (main thread only), restores them in ``__exit__``."""

    def __init__(self):
        self.signum: int | None = None
        self._old: dict = {}
        self._steps = 0
        self._kill_after = int(os.environ.get(ENV_KILL_AFTER) or 0)
        self._signal_after = int(os.environ.get(ENV_SIGNAL_AFTER) or 0)

    def _handler(self, signum, frame):
        self.signum = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False

    def __bool__(self) -> bool:
        return self.signum is not None

    def step_done(self) -> None:
        """Called after every optimizer step (drives the test-only hooks)."""
        self._steps += 1
        if self._kill_after and self._steps == self._kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if self._signal_after and self._steps == self._signal_after:
            os.kill(os.getpid(), getattr(signal, "SIG" + os.environ.get(ENV_SIGNAL, "TERM")))
