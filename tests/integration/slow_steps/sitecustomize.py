"""Test hook for tests/integration/test_slurm.py, active only with DMLREPRO_TEST_STEP_SECONDS=s set.

On PYTHONPATH, every Python process started with it (snakemake, the SLURM job's snakemake, the
training script) sleeps ``s`` seconds before each ``StopFlag.step_done`` of dmlrepro's training
engine, so that a tiny run outlasts a one-minute SLURM allocation without burning CPU. Sleeping
between steps changes no number: the run's results are those of an undisturbed run.
"""

import importlib.machinery
import os
import sys
import time


class _SlowSteps:
    """A meta-path finder that patches dmlrepro.train.preemption right after it is executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "dmlrepro.train.preemption":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module
        delay = float(os.environ["DMLREPRO_TEST_STEP_SECONDS"])

        def exec_module(module):
            execute(module)
            step_done = module.StopFlag.step_done

            def slow_step_done(self):
                time.sleep(delay)
                step_done(self)

            module.StopFlag.step_done = slow_step_done

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("DMLREPRO_TEST_STEP_SECONDS"):
    sys.meta_path.insert(0, _SlowSteps())
