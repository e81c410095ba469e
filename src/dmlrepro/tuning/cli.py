"""`dmlrepro tune SEARCH_CONFIG OUTDIR`: a Bayesian-optimisation search from a YAML file.

SEARCH_CONFIG (docs/tuning.md)::

    base: {...}            # a partial run config, or the path of a run-config YAML (relative to this file)
    space: {asap.lam: {type: float, low: 1.0e-6, high: 1.0, log: true, zero: true}, ...}
    trials: 35             # completed trials to reach (a later call with a larger number continues)
    folds: [0, 1, 2, 3]    # or null: one run per trial, the base config's own validation split
    seed: 0
    sampler: gp            # gp | tpe | random
    direction: maximize    # maximize | minimize
    startup_trials: 10     # random trials before the sampler's model is used
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from dmlrepro.train import load_run_config

from .bayes import DIRECTIONS, SAMPLERS, SearchError, run_search

KEYS = {
    "base": None,
    "space": None,
    "trials": None,
    "folds": None,
    "seed": 0,
    "sampler": "gp",
    "direction": "maximize",
    "startup_trials": 10,
}
REQUIRED = ("base", "space", "trials")


class SearchConfigError(ValueError):
    pass


def load_search_config(path: str | Path) -> dict[str, Any]:
    """Read and check SEARCH_CONFIG; returns every key (defaults filled in), ``base`` loaded."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SearchConfigError(f"{path}: cannot read ({error.strerror or error})") from None
    except yaml.YAMLError as error:
        raise SearchConfigError(f"{path}: not valid YAML ({error})") from None
    if not isinstance(data, dict):
        raise SearchConfigError(f"{path}: expected a mapping with keys {', '.join(KEYS)}")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise SearchConfigError(f"{path}: unknown key(s) {unknown}; allowed: {', '.join(KEYS)}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise SearchConfigError(f"{path}: missing key(s) {missing} (required: {', '.join(REQUIRED)})")
    cfg = {**KEYS, **data}
    base = cfg["base"]
    if isinstance(base, str):
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        try:
            base = load_run_config(base_path)
        except OSError as error:
            raise SearchConfigError(
                f"{path}: base = {cfg['base']!r}: cannot read {base_path} ({error.strerror or error})"
            ) from None
    if not isinstance(base, dict):
        raise SearchConfigError(
            f"{path}: base: expected a run-config mapping or the path of a run-config YAML, got {base!r}"
        )
    cfg["base"] = base
    for key in ("trials", "seed", "startup_trials"):
        v = cfg[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "trials" else 0):
            raise SearchConfigError(f"{path}: {key} = {v!r}: expected an integer >= {1 if key == 'trials' else 0}")
    folds = cfg["folds"]
    if folds is not None and (
        not isinstance(folds, list)
        or not folds
        or not all(isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in folds)
    ):
        raise SearchConfigError(f"{path}: folds = {folds!r}: expected a non-empty list of fold numbers or null")
    if cfg["sampler"] not in SAMPLERS:
        raise SearchConfigError(f"{path}: sampler = {cfg['sampler']!r}: expected one of {', '.join(SAMPLERS)}")
    if cfg["direction"] not in DIRECTIONS:
        raise SearchConfigError(f"{path}: direction = {cfg['direction']!r}: expected one of {', '.join(DIRECTIONS)}")
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dmlrepro tune",
        description="Bayesian-optimisation search of run-config keys (docs/tuning.md). "
        "Resumes when run again with the same SEARCH_CONFIG and OUTDIR.",
    )
    parser.add_argument(
        "search_config", help="YAML: {base, space, trials, folds, seed, sampler, direction, startup_trials}"
    )
    parser.add_argument("outdir", help="output folder (study.db, trials/, trials.csv, best.json)")
    parser.add_argument("--trials", type=int, default=None, help="override `trials` (completed trials to reach)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    try:
        cfg = load_search_config(args.search_config)
        if args.trials is not None:
            cfg["trials"] = args.trials
        best = run_search(
            cfg["base"],
            cfg["space"],
            args.outdir,
            trials=cfg["trials"],
            folds=cfg["folds"],
            seed=cfg["seed"],
            sampler=cfg["sampler"],
            direction=cfg["direction"],
            startup_trials=cfg["startup_trials"],
            progress=False if args.no_progress else None,
        )
    except (ValueError, SearchError) as error:  # ConfigError is a ValueError
        print(f"dmlrepro tune: {error}", file=sys.stderr)
        return 2
    if best is None:
        print("dmlrepro tune: no completed trial", file=sys.stderr)
        return 1
    print(f"best value {best['value']:.6g} (trial {best['trial']}, {best['n_trials']} completed trials)")
    for key, value in best["params"].items():
        print(f"  {key}: {json.dumps(value)}")
    print(f"runs: {', '.join(best['runs'])}; details: {Path(args.outdir) / 'best.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
