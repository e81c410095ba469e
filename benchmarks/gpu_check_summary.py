"""The GPU check's summary (benchmarks/gpu_check.sh): the step outputs of WORK -> gpu_check.json and
gpu_check.md in RET, and its verdict as the exit status: 1 when CUDA is absent (``--check full``) or the
CUDA lane did not run, failed or skipped a test. Usage: gpu_check_summary.py WORK RET [--check full|tiny]"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _junit(path: Path) -> dict | None:
    """passed / failed / errors / skipped of a pytest --junitxml file."""
    try:
        suites = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites.iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def _cases(path: Path) -> list[dict]:
    doc = _json(path)
    return doc["cases"] if doc else []


def summary(work: Path) -> dict:
    steps = (
        [json.loads(line) for line in (work / "steps.jsonl").read_text().splitlines()]
        if (work / "steps.jsonl").is_file()
        else []
    )
    preflight = _preflight(work)
    return {
        "probe": _json(work / "probe.json"),
        "steps": steps,
        "cuda_lane": _junit(work / "cuda_lane.xml"),
        "lane_measurements": {p.stem: _json(p) for p in sorted((work / "lane").glob("*.json"))},
        "suite_device_auto": _junit(work / "suite_device_auto.xml"),
        "pipeline_all_cpus": _cases(work / "pipeline_all.json"),
        "pipeline_8_cpus": _cases(work / "pipeline_8cpu.json"),
        "epoch": _cases(work / "epoch.json"),
        "device_pipeline": _json(work / "device_pipeline.json"),
        "preflight": preflight,
        "miniature_preflight": _json(work / "miniature_preflight.json"),
    }


def _preflight(work: Path) -> dict | None:
    """The preflight steps' results (one JSON per experiment), merged: shapes, projected hours, runs over budget."""
    parts = [doc for doc in (_json(p) for p in sorted(work.glob("preflight_*.json"))) if doc]
    if not parts:
        return None
    return {
        "configs": [c for doc in parts for c in doc["configs"]],
        "total_hours": sum(doc["total_hours"] for doc in parts),
        "over_budget": [r for doc in parts for r in doc["over_budget"]],
    }


def verdict(doc: dict, check: str) -> list[str]:
    """Why the check failed (empty: it passed): CUDA absent on a full check; the lane missing, failing or skipping."""
    problems = []
    probe = doc["probe"] or {}
    if check == "full" and not probe.get("cuda_available"):
        problems.append(f"CUDA is not available (torch {probe.get('torch')}, CUDA build {probe.get('cuda_runtime')})")
    lane = doc["cuda_lane"]
    if not lane or lane["tests"] == 0:
        problems.append("the CUDA lane did not run")
    elif lane["failures"] or lane["errors"] or lane["skipped"]:
        problems.append(f"the CUDA lane: {lane['failures']} failed, {lane['errors']} errors, {lane['skipped']} skipped")
    return problems


def _ratio_rows(title: str, cases: list[dict]) -> list[str]:
    return [
        f"| {title}: {c['case']} | {c.get('images_per_s', 0):,.0f} img/s"
        + (f", {c['ratio_to_anchor']:.3f} of {c['anchor']} (target {c['target']})" if c.get("anchor") else "")
        + " |"
        for c in cases
    ]


def _eval_rows(configs: list[dict]) -> list[str]:
    """The preflight's evaluation against training: eval img/s over step img/s per shape (target ≥ 2)."""
    shapes = [c for c in configs if c.get("eval_images_per_second") and c.get("synthetic_images_per_second")]
    if not shapes:
        return []
    ratios = sorted(c["eval_images_per_second"] / c["synthetic_images_per_second"] for c in shapes)
    evals = sorted(c["eval_images_per_second"] for c in shapes)
    metrics = [c["eval_metric_seconds"] for c in shapes if c.get("eval_metric_seconds") is not None]
    return [
        f"| preflight evaluation, {len(shapes)} shapes | {evals[0]:,.0f}–{evals[-1]:,.0f} img/s; eval / step "
        f"img/s {ratios[0]:.2f}–{ratios[-1]:.2f} (target ≥ 2); metrics "
        f"{max(metrics, default=0):.3f} s at most |"
    ]


def markdown(doc: dict, work: Path) -> str:
    probe = doc["probe"] or {}
    lines = [
        f"# GPU check: {probe.get('device_name')} (torch {probe.get('torch')}, CUDA {probe.get('cuda_runtime')}, "
        f"commit {str(probe.get('commit'))[:7]})",
        "",
        "**Failed:** " + "; ".join(doc["verdict"])
        if doc["verdict"]
        else f"**Passed** ({'CUDA present' if doc['check'] == 'full' else 'a CPU dry run'}, every lane test ran)",
        "",
        "| check | result |",
        "|---|---|",
    ]
    for s in doc["steps"]:
        lines.append(f"| step {s['step']} | exit {s['exit']} in {s['seconds']} s (limit {s['limit']} s) |")
    for name in ("cuda_lane", "suite_device_auto"):
        c = doc[name]
        if c:
            lines.append(
                f"| {name} | {c['passed']} passed, {c['failures']} failed, {c['errors']} errors, "
                f"{c['skipped']} skipped |"
            )
    for name, values in doc["lane_measurements"].items():
        lines.append(f"| lane: {name} | `{json.dumps(values)}` |")
    lines += _ratio_rows("pipeline, all CPUs", doc["pipeline_all_cpus"])
    lines += _ratio_rows("pipeline, 8 CPUs", doc["pipeline_8_cpus"])
    for c in doc["epoch"]:
        extra = f", {c['ratio_to_anchor']:.3f} of {c['anchor']}" if c.get("anchor") else ""
        lines.append(f"| epoch: {c['case']} | {c['epoch_s']:.2f} s{extra} |")
    if doc["device_pipeline"]:
        lines.append(f"| device pipeline (nvJPEG vs CPU decode) | `{json.dumps(doc['device_pipeline'])[:400]}` |")
    if doc["preflight"]:
        p = doc["preflight"]
        lines.append(
            f"| preflight | {len(p['configs'])} shapes, {p['total_hours']:,.1f} h projected, "
            f"{len(p['over_budget'])} runs over budget |"
        )
        lines += _eval_rows(p["configs"])
    if doc["miniature_preflight"]:
        p = doc["miniature_preflight"]
        lines.append(
            f"| the faithful miniature's preflight | {len(p['configs'])} shapes, {p['total_hours']:,.2f} h with every "
            "run at its cap (an upper bound: its runs stop at their validation plateaus) |"
        )
    texts = [work / "retrieval.log", work / "miniature_preflight.txt", *sorted(work.glob("preflight_*.txt"))]
    for path in texts:
        if path.is_file():
            lines += ["", f"## {path.name}", "```", *path.read_text().splitlines()[-30:], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("work", type=Path)
    parser.add_argument("ret", type=Path)
    parser.add_argument("--check", default="full", choices=("full", "tiny"))
    args = parser.parse_args()
    doc = summary(args.work)
    doc["check"], doc["verdict"] = args.check, verdict(doc, args.check)
    (args.ret / "gpu_check.json").write_text(json.dumps(doc, indent=1))
    (args.ret / "gpu_check.md").write_text(markdown(doc, args.work))
    for problem in doc["verdict"]:
        print(f"gpu check: failed: {problem}")
    return int(bool(doc["verdict"]))


if __name__ == "__main__":
    raise SystemExit(main())
