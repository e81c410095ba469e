"""What another stopping rule would have cost and kept, from finished runs' validation curves.

Replays every run under ``--results`` whose stopping rule decides only *when* it stops (a validation
patience, no follow-up phase started at a plateau, no ASAP alternation), so its recorded curve
(``train_log.csv``: validation MAP@R and training seconds per epoch) is the one it would have followed
under any rule. For each (patience, min_delta) the rule of docs/training.md (an evaluation improves iff
value > best + min_delta; stop after `patience` evaluations without one) gives the stopping epoch and the
best-validation epoch it keeps. The anchor is each run's own recorded rule, replayed the same way.

Prints, per group of runs with one recorded rule and per rule replayed: the training seconds of the
epochs run, as a ratio to the anchor's, and how much validation MAP@R the kept epoch gives up against
the anchor's (largest and mean over the group's runs).

    python benchmarks/replay_stopping_rule.py --results results/miniature \
        --rule 10:1e-5 --rule 10:1e-3 --rule 10:2e-3 --rule 8:1e-3
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

import yaml


def stop(curve: list[tuple[int, float]], patience: int, min_delta: float) -> tuple[int, int, float]:
    """(stopping epoch, kept epoch, its validation value) of `curve` [(epoch, value)] under the rule."""
    best, kept, bad = float("-inf"), curve[0][0], 0
    for epoch, value in curve:
        if value > best + min_delta:
            best, kept, bad = value, epoch, 0
        else:
            bad += 1
        if bad >= patience:
            return epoch, kept, best
    return curve[-1][0], kept, best


def replayable(cfg: dict) -> bool:
    """The run's trajectory does not depend on when validation says stop."""
    v, followup = cfg.get("validation") or {}, cfg.get("followup") or {}
    asap = (cfg.get("asap") or {}).get("enabled", False)
    return v.get("patience") is not None and followup.get("trigger") != "plateau" and not asap


def load(results: Path) -> list[dict]:
    runs = []
    for rundir in sorted((results / "runs").iterdir()):
        cfg_file, log_file = rundir / "config.yaml", rundir / "train_log.csv"
        if not (cfg_file.exists() and log_file.exists()):
            continue
        cfg = yaml.safe_load(cfg_file.read_text())
        if not replayable(cfg):
            continue
        rows = [r for r in csv.DictReader(log_file.open()) if r["val_map@r"]]
        runs.append(
            {
                "run": rundir.name,
                "rule": (cfg["validation"]["patience"], cfg["validation"]["min_delta"]),
                "curve": [(int(r["epoch"]), float(r["val_map@r"])) for r in rows],
                "seconds": {int(r["epoch"]): float(r["seconds"] or 0) for r in rows},
            }
        )
    return runs


def replay(runs: list[dict], patience: int, min_delta: float) -> dict:
    cost = anchor_cost = 0.0
    given_up = []
    for run in runs:
        own_stop, _, own_best = stop(run["curve"], *run["rule"])
        at, _, best = stop(run["curve"], patience, min_delta)
        cost += sum(s for e, s in run["seconds"].items() if e <= at)
        anchor_cost += sum(s for e, s in run["seconds"].items() if e <= own_stop)
        given_up.append(own_best - best)
    return {
        "patience": patience,
        "min_delta": min_delta,
        "runs": len(runs),
        "training_seconds": round(cost),
        "anchor_seconds": round(anchor_cost),
        "ratio": round(cost / anchor_cost, 3),
        "map_r_given_up_max": round(max(given_up), 4),
        "map_r_given_up_mean": round(statistics.fmean(given_up), 5),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, required=True, help="a workflow's results directory (its runs/)")
    ap.add_argument("--rule", action="append", required=True, help="PATIENCE:MIN_DELTA, e.g. 10:1e-3 (repeatable)")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON")
    args = ap.parse_args()
    runs = load(args.results)
    if not runs:
        raise SystemExit(f"replay_stopping_rule: no replayable run under {args.results}/runs")
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault(run["rule"], []).append(run)
    rows = []
    for own, group in sorted(groups.items()):
        for rule in args.rule:
            patience, min_delta = rule.split(":")
            rows.append({"recorded_rule": list(own), **replay(group, int(patience), float(min_delta))})
            print(json.dumps(rows[-1]))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
