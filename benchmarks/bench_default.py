"""Where the embedded default's time goes: runs ``snakemake --cores N`` on a copy of this checkout
(the tracked and untracked, not ignored files: what a fresh clone holds, so data, the digit trunk and
runs are made anew) and reports CPU seconds (user + system) by job kind.

Every Python job (and Snakemake itself) writes its own CPU time (``getrusage``: the process and its
waited-for children, e.g. DataLoader workers) at exit through a ``sitecustomize`` put first on the
PYTHONPATH of this benchmark's Snakemake only; a job run by the job server (docs/workflow.md#job-server)
adds its forked child's CPU, which the server reports to it, and the server's own imports are a kind
of their own; Snakemake's own CPU is its process's time, and what
no Python job reports (each job's interpreter teardown after its atexit hooks: about 0.85 CPU-s
for a process that imported torch; shells; the ILP scheduler's solver) is the rest of Snakemake's
children.
CPU seconds rather than wall: the total divided by the cores is the wall time on idle cores
(when the jobs keep every core busy), also when the machine is shared.

    nice -n 5 .venv/bin/python benchmarks/bench_default.py --workdir /tmp/bench_default --out bench_default.json
    .venv/bin/python benchmarks/bench_default.py --summarise /tmp/bench_default/rusage.jsonl   # a finished log
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HOOK = """import atexit, json, os, resource, sys, time
_T0, _PID0 = time.time(), os.getpid()
def _dump():
    if os.getpid() != _PID0:  # a fork of the job server: its job's process reports its CPU ("served")
        return
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sm = getattr(sys.modules.get("__main__"), "snakemake", None)
    rec = {"pid": os.getpid(), "argv": sys.argv[:2], "t0": _T0, "wall": time.time() - _T0,
           "self": s.ru_utime + s.ru_stime, "children": c.ru_utime + c.ru_stime,
           "served": getattr(sys.modules.get("dmlrepro.jobserver"), "child_cpu_seconds", 0.0),
           "server": "dmlrepro.jobserver" in " ".join(sys.orig_argv)}
    if hasattr(sm, "rule"):
        rec.update(rule=sm.rule, wildcards=dict(sm.wildcards.items()))
    with open(os.environ["BENCH_DEFAULT_LOG"], "a") as f:
        f.write(json.dumps(rec) + "\\n")
atexit.register(_dump)
"""


def copy_checkout(dest: Path) -> None:
    """The files a fresh clone (plus this checkout's uncommitted changes) holds, into dest."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "--null", "-T", "-", "-cf", str(dest / "tree.tar")], cwd=REPO, input=files, check=True)
    (dest / "tree").mkdir()
    subprocess.run(["tar", "-xf", str(dest / "tree.tar"), "-C", str(dest / "tree")], check=True)
    (dest / "tree.tar").unlink()


def job_kind(record: dict) -> str:
    """train:<method> (the run id's first field), search, pretrain_digit_trunk, ... or snakemake."""
    rule = record.get("rule")
    if record.get("server"):
        return "job server (its imports)"
    if rule == "train":
        return "train:" + record["wildcards"]["run"].split("-")[0]
    if rule:
        return rule
    return "snakemake (own process)" if "snakemake" in " ".join(record["argv"]) else "other python"


def summarise(log: Path, total: float | None = None) -> dict:
    """CPU seconds, job count and summed job wall by kind; `total`: Snakemake's and all its
    children's CPU (the rest is what no Python job reported)."""
    kinds: dict = collections.defaultdict(lambda: {"jobs": 0, "cpu_s": 0.0, "wall_s": 0.0})
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    for rec in records:
        kind = job_kind(rec)
        row = kinds[kind]
        row["jobs"] += 1
        own_children = not (kind.startswith("snakemake") or rec.get("server"))  # theirs are reported apart
        row["cpu_s"] += rec["self"] + rec.get("served", 0.0) + (rec["children"] if own_children else 0.0)
        row["wall_s"] += rec["wall"]
    if total is not None:
        kinds["unreported (teardown, shells, ILP solver)"]["cpu_s"] = total - sum(r["cpu_s"] for r in kinds.values())
    return {
        "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["cpu_s"])),
        "cpu_s": sum(r["cpu_s"] for r in kinds.values()),
    }


def print_table(summary: dict, cores: int) -> None:
    print("| kind | jobs | CPU s | CPU s / job |\n|---|---|---|---|")
    for kind, row in summary["kinds"].items():
        per = f"{row['cpu_s'] / row['jobs']:.2f}" if row["jobs"] else ""
        print(f"| {kind} | {row['jobs'] or ''} | {row['cpu_s']:.1f} | {per} |")
    print(f"| **all** | | **{summary['cpu_s']:.1f}** | |")
    print(f"CPU total / {cores} cores = {summary['cpu_s'] / cores / 60:.1f} min")


def run(workdir: Path, cores: int, extra: list[str]) -> dict:
    workdir.mkdir(parents=True)
    copy_checkout(workdir)
    (workdir / "hook").mkdir()
    (workdir / "hook" / "sitecustomize.py").write_text(HOOK)
    log = workdir / "rusage.jsonl"
    env = {
        **os.environ,
        "BENCH_DEFAULT_LOG": str(log),
        "PYTHONPATH": os.pathsep.join(
            [
                str(workdir / "hook"),
                str(workdir / "tree" / "src"),  # the copy's code
                *filter(None, [os.environ.get("PYTHONPATH")]),
            ]
        ),
    }
    snakemake = Path(sys.executable).with_name("snakemake")
    start = time.time()
    with open(workdir / "snakemake.log", "w") as out:
        subprocess.run(
            [str(snakemake), "--cores", str(cores), *extra],
            cwd=workdir / "tree",
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
        )
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = summarise(log, total=ru.ru_utime + ru.ru_stime)
    summary.update(wall_s=time.time() - start, cores=cores, snakemake_args=extra)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, help="a new folder: the checkout's copy, its results, the log")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--out", type=Path, help="JSON summary")
    parser.add_argument("--summarise", type=Path, help="only summarise this rusage.jsonl")
    args, extra = parser.parse_known_args()
    if args.summarise:
        summary = summarise(args.summarise)
    elif args.workdir:
        summary = run(args.workdir, args.cores, extra)
        print(f"wall {summary['wall_s']:.0f} s")
    else:
        parser.error("--workdir or --summarise")
    print_table(summary, args.cores)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
