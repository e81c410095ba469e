"""Snakemake's pending scheduler timers, cancelled when the workflow ends.

Snakemake's job rate limit (``max-jobs-per-timespan``) schedules a new pass of its scheduling loop
one timespan after every pass, on a non-daemon ``threading.Timer``, and every finished job starts
one more such chain: after N finished jobs, about N passes a timespan, each checking every ready
job's inputs. The default profile's ``1000/10s`` (the same average limit as Snakemake's default
``100/1s``) makes them ten times rarer; then the interpreter would wait up to 10 s at exit for the
last timers. The Snakefile's onsuccess/onerror cancel them: the loop they would wake has ended
(docs/benchmarks.md#snakemakes-own-process).
"""

from __future__ import annotations

import threading


def cancel_pending_timers() -> int:
    """Cancel every pending ``threading.Timer`` of this process; returns how many there were."""
    timers = [thread for thread in threading.enumerate() if isinstance(thread, threading.Timer)]
    for timer in timers:
        timer.cancel()
    return len(timers)
