"""Where the report's numbers come from: code version, packages, device, and per run its config
hash, status and training time; per experiment its compute hours (docs/report.md)."""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from dmlrepro.environment_lock import lock_record

from .timing import timing_metrics

PACKAGES = (
    "dmlrepro",
    "torch",
    "torchvision",
    "timm",
    "pytorch-metric-learning",
    "faiss-cpu",
    "faiss-gpu-cu12",
    "numpy",
    "scikit-learn",
    "snakemake",
    "snakemake-executor-plugin-slurm",
    "matplotlib",
    "jinja2",
)


def git_commit(repo: str | Path) -> str:
    """`<commit>` or `<commit> (modified)`; `unknown` outside a git checkout."""

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30)

    head = git("rev-parse", "HEAD")
    if head.returncode:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + (" (modified)" if dirty else "")


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def device_description() -> str:
    import torch  # deferred: dmlrepro.report imports without torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}) on {platform.node()}"
    threads = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    return f"CPU ({cpu}, {threads} thread{'' if threads == 1 else 's'}) on {platform.node()}"


def provenance(
    repo: str | Path,
    runs: Sequence[Mapping[str, Any]],
    experiments: Mapping[str, Sequence[str]],
    preflight: str | Path | None = None,
) -> dict[str, Any]:
    """`runs`: each with run_id, method, dataset, seed, status, device, train_hours, epochs.
    `experiments`: name -> its run ids (a run shared by tables counts in each). `preflight`: a
    `dmlrepro preflight` JSON; when it exists, its projected hours stand beside the measured ones."""
    hours = {r["run_id"]: r.get("train_hours") or 0.0 for r in runs}
    return {
        **projected_hours(preflight),
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(repo),
        "python": platform.python_version(),
        "packages": package_versions(),
        "lock": lock_record(repo),  # requirements.lock's pins and how this environment differs (docs/environment.md)
        "report_device": device_description(),
        "runs": [{**UNRECORDED_PRECISION, **r, "config_hash": r["run_id"].rsplit("-", 1)[-1]} for r in runs],
        "mixed_hardware": mixed_hardware(runs, experiments),
        "hours_per_experiment": {name: sum(hours.get(i, 0.0) for i in ids) for name, ids in experiments.items()},
        "total_hours": sum(hours.values()),
    }


def projected_hours(preflight: str | Path | None) -> dict[str, Any]:
    """From a preflight JSON (docs/preflight.md): `projected_hours_per_experiment`,
    `projected_total_hours` and `preflight_device`; nothing when there is no such file."""
    if preflight is None or not Path(preflight).is_file():
        return {}
    doc = json.loads(Path(preflight).read_text())
    device = doc.get("device") or {}
    return {
        "projected_hours_per_experiment": {e["name"]: e["hours"] for e in doc.get("experiments", [])},
        "projected_total_hours": doc.get("total_hours"),
        "preflight_device": f"{device.get('name')} ({device.get('device')})",
    }


#: a run from before metrics.json recorded its precisions (docs/readings/protocols.md#proto-r9)
UNRECORDED_PRECISION = {"train_precision": "not recorded", "eval_precision": "not recorded"}

#: the file in each report section's folder that lists the section's runs for the provenance table
SECTION_RUNS = "runs.json"


def section_runs(
    runs: Sequence[Mapping[str, Any]], metrics_files: Sequence[str | Path], train_logs: Sequence[str | Path]
) -> list[dict[str, Any]]:
    """One experiment's runs as the provenance table lists them: run_id, method, dataset, seed, epochs
    (from each run's resolved `config`: the cap), stopped_epoch (metrics.json: where early stopping ended the
    run; None at the cap), status, device (:func:`device_text`) and training / evaluation
    precision (metrics.json; the config's device for a run recorded before the precision was), hardware
    (:func:`hardware`) and train_hours (train_log.csv)."""
    out = []
    for run, metrics, log in zip(runs, metrics_files, train_logs, strict=True):
        record = json.loads(Path(metrics).read_text())
        precision = record.get("precision") or {}
        out.append(
            {
                "run_id": run["run_id"],
                "method": run["method"],
                "dataset": run["dataset"],
                "seed": run["seed"],
                "device": device_text(precision, run["config"]["device"]),
                "hardware": hardware(precision),
                "epochs": run["config"]["epochs"],
                "stopped_epoch": record.get("stopped_epoch"),
                **UNRECORDED_PRECISION,
                **{f"{k}_precision": precision[k] for k in ("train", "eval") if k in precision},
                "status": record.get("status"),
                "train_hours": timing_metrics(log).get("train_hours", 0.0),
            }
        )
    return out


def device_text(precision: Mapping[str, Any], configured: str) -> str:
    """The device a run trained on (metrics.json's `precision`, else the `configured` one) and, where
    recorded, the hardware behind it: the device's name, a GPU's uuid and the workflow's GPU slot
    (`cuda:0 (NVIDIA H200; <its uuid>; slot 2)`), a CPU's kernels and their digest
    (`cpu (Intel Xeon; AVX2 kernels; digest 23f64dd0d71b)`: dmlrepro.cpu_isa)."""
    device = precision.get("device", configured)
    facts = [precision.get("device_name"), precision.get("gpu_uuid")]
    if precision.get("gpu_slot"):
        facts.append(f"slot {precision['gpu_slot']}")
    if str(device) == "cpu" and precision.get("cpu_kernels"):
        facts.append(f"{precision['cpu_kernels']} kernels")
    if str(device) == "cpu" and precision.get("kernel_digest"):
        facts.append(f"digest {precision['kernel_digest']}")
    facts = [str(fact) for fact in facts if fact]
    return f"{device} ({'; '.join(facts)})" if facts else str(device)


def hardware(precision: Mapping[str, Any]) -> str | None:
    """What, beside its run id, decides a run's bits: a GPU's name; a CPU run's kernel digest (recorded since
    dmlrepro.cpu_isa.kernel_digest; before, the CPU's name and kernels). None when metrics.json names neither."""
    if str(precision.get("device", "")).startswith("cuda"):
        return precision.get("device_name")
    if precision.get("kernel_digest"):
        return f"CPU kernels with digest {precision['kernel_digest']}"
    if precision.get("device_name"):
        return f"{precision['device_name']}, {precision.get('cpu_kernels')} kernels (no digest recorded)"
    return None


def mixed_hardware(
    runs: Sequence[Mapping[str, Any]], experiments: Mapping[str, Sequence[str]]
) -> dict[str, dict[str, list[str]]]:
    """experiment -> {kind of :func:`hardware`: its run ids}, for each experiment whose runs came from more
    than one kind: its seeds are not one host's, so rerunning them on one host gives other numbers
    (docs/training.md#between-intel-and-amd). Runs that name no hardware are left out."""
    kinds = {run["run_id"]: run.get("hardware") for run in runs}
    mixed = {}
    for name, ids in experiments.items():
        found: dict[str, list[str]] = {}
        for run_id in ids:
            if kinds.get(run_id):
                found.setdefault(kinds[run_id], []).append(run_id)
        if len(found) > 1:
            mixed[name] = dict(sorted(found.items()))
    return mixed


def collect_section_runs(sections: Mapping[str, str | Path]) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """(every run once, experiment -> its run ids) from the sections' runs.json (experiment -> folder)."""
    runs: dict[str, dict[str, Any]] = {}
    experiments = {}
    for name, folder in sections.items():
        path = Path(folder) / SECTION_RUNS
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: the report section of {name} was built before sections listed their "
                f"runs; rebuild the sections: snakemake --forcerun report_section"
            )
        listed = json.loads(path.read_text())
        experiments[name] = [run["run_id"] for run in listed]
        for run in listed:
            runs.setdefault(run["run_id"], run)
    return list(runs.values()), experiments
