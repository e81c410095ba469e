"""dmlrepro.scheduler_timers: the Snakefile's onsuccess/onerror cancel Snakemake's pending timers."""

from __future__ import annotations

import threading

from dmlrepro.scheduler_timers import cancel_pending_timers


def test_pending_timers_are_cancelled_and_never_fire():
    fired = []
    timers = [threading.Timer(30.0, fired.append, args=(i,)) for i in range(3)]
    for timer in timers:
        timer.start()
    other = threading.Thread(target=threading.Event().wait, args=(0.5,))  # not a timer: left alone
    other.start()
    assert cancel_pending_timers() == 3
    for timer in timers:
        timer.join(timeout=5)
        assert not timer.is_alive()
    other.join()
    assert fired == []
