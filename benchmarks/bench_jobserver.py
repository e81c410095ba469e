"""A training job through the job server vs in its own interpreter (docs/workflow.md#job-server).

Runs ``--jobs`` short training jobs of one run config each way, interleaved (in-process, served,
in-process, ...), each as a job process that calls ``dmlrepro.jobserver.run_job`` as the workflow's
scripts do, and reports per job: wall seconds and CPU seconds (user + system of the job process,
its waited-for children and, when served, the forked child). Anchor: the in-process job; the
ratio is served / in-process. The server's own imports are paid once per workflow and reported apart.

    .venv/bin/python benchmarks/bench_jobserver.py --jobs 5 --out bench_jobserver.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dmlrepro import jobserver

JOB = """
import json, sys
from dmlrepro import jobserver
jobserver.run_job("dmlrepro.train:train_run", json.loads(sys.argv[1]), sys.argv[2], progress=False, log=sys.argv[3])
print(jobserver.child_cpu_seconds)  # 0 in-process
"""


def run_config(data_root: Path, epochs: int) -> dict:
    """A digits run of a few seconds: tiny_cnn at 32 px, PFML, one torch thread."""
    return {
        "dataset": {"name": "digits", "root": str(data_root), "image_size": 32, "resize": 32, "batch_size": 32},
        "model": {"backbone": "tiny_cnn", "embedding_size": 16},
        "loss": {"name": "pfml"},
        "epochs": epochs,
        "steps_per_epoch": 8,
        "seed": 0,
        "threads": 1,
        "num_workers": 0,
    }


def one_job(config: dict, folder: Path, served: bool) -> dict:
    env = dict(os.environ)
    if not served:
        env.pop(jobserver.JOBSERVER_ENV, None)
    start = time.perf_counter()
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, json.dumps(config), str(folder), str(folder) + ".log"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    served_cpu = float(job.stdout.read().strip().splitlines()[-1])
    _, status, usage = os.wait4(job.pid, 0)  # the job process (teardown included) and its children
    job.returncode = os.waitstatus_to_exitcode(status)
    assert job.returncode == 0, f"{folder}: exit {job.returncode}"
    return {"wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime + served_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5, help="jobs each way")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from dmlrepro.data import prepare

    work = Path(tempfile.mkdtemp(prefix="bench-jobserver-"))
    prepare("digits", work / "data", progress=False)
    config = run_config(work / "data", args.epochs)
    server = jobserver.start(work)
    rows: dict[str, list[dict]] = {"in_process": [], "served": []}
    try:
        for i in range(args.jobs):
            for way in rows:
                rows[way].append(one_job(config, work / f"{way}-{i}", served=way == "served"))
    finally:
        jobserver.stop(server)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the jobs, the server and its forks
    jobs_cpu = sum(r["cpu_s"] for runs in rows.values() for r in runs)  # served forks included
    summary = {
        way: {key: statistics.median(r[key] for r in runs) for key in ("wall_s", "cpu_s")} for way, runs in rows.items()
    }
    summary["server_cpu_s"] = children.ru_utime + children.ru_stime - jobs_cpu  # its imports, paid once

    summary["ratio_served_over_in_process"] = {
        key: summary["served"][key] / summary["in_process"][key] for key in ("wall_s", "cpu_s")
    }
    summary["jobs_each_way"] = args.jobs
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
