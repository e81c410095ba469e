"""Test hook for tests/integration/test_slurm.py and tests/faults/test_workflow_faults.py, active only
with DMLREPRO_TEST_STEP_SECONDS=s or DMLREPRO_TEST_STEP_GATE=path set.

On PYTHONPATH, every Python process started with it (snakemake, the SLURM job's snakemake, the
training script) runs, before each ``StopFlag.step_done`` of dmlrepro's training engine: a wait
while the file ``path`` exists (at most 10 minutes; the test removes it to let the run go on), then
a sleep of ``s`` seconds, so that a tiny run outlasts a one-minute SLURM allocation, or an orphaned
train job is still training when the rerun starts, without burning CPU. Waiting between steps
changes no number: the run's results are those of an undisturbed run.
"""

import importlib.machinery
import os
import sys
import time

GATE_MAX_SECONDS = 600


class _SlowSteps:
    """A meta-path finder that patches dmlrepro.train.preemption right after it is executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "dmlrepro.train.preemption":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module
        delay = float(os.environ.get("DMLREPRO_TEST_STEP_SECONDS") or 0)
        gate = os.environ.get("DMLREPRO_TEST_STEP_GATE")

        def exec_module(module):
            execute(module)
            step_done = module.StopFlag.step_done

            def slow_step_done(self):
                end = time.monotonic() + GATE_MAX_SECONDS
                while gate and os.path.exists(gate) and time.monotonic() < end:
                    time.sleep(0.1)
                time.sleep(delay)
                step_done(self)

            module.StopFlag.step_done = slow_step_done

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("DMLREPRO_TEST_STEP_SECONDS") or os.environ.get("DMLREPRO_TEST_STEP_GATE"):
    sys.meta_path.insert(0, _SlowSteps())
