"""Every shipped config (CONFIGS) resolves to the run ids pinned in tests/config/pinned/: a refactoring
that changes a run's identity fails here. A deliberate change of an experiment (a new recipe, a new
run) pins the new list with the explicit `python tests/config/test_run_ids_pinned.py --rewrite`
(docs/testing.md; say in the commit which ids changed and why); run without `--rewrite` the script
only says which ids differ and writes nothing."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from dmlrepro.runs import resolve_runs
from dmlrepro.tuning.searches import search_runs

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).with_name("pinned")
CONFIGS = ("config", "paper", "real_data", "miniature")


def resolved_ids(name: str) -> list[str]:
    """The run and search ids of config/NAME.yaml as the workflow resolves them (schema defaults applied)."""
    config = yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())
    validate(config, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    return sorted(resolve_runs(config)) + sorted(search_runs(config))


@pytest.mark.parametrize("name", CONFIGS)
def test_config_run_ids_are_pinned(name):
    assert resolved_ids(name) == (PINNED / f"run_ids_{name}.txt").read_text().split()


def test_the_script_writes_nothing_unless_told_to(tmp_path):
    """Run as a script it reports a difference (exit 1) and leaves the pinned file as it was; only
    --rewrite pins the resolved ids."""
    pinned = tmp_path / "run_ids_config.txt"
    pinned.write_text("an-old-run-id\n")
    done = subprocess.run(
        [sys.executable, __file__, "--pinned", str(tmp_path), "--config", "config"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "nothing written" in done.stdout and "-['an-old-run-id']" in done.stdout, done
    assert pinned.read_text() == "an-old-run-id\n"
    assert main(["--pinned", str(tmp_path), "--config", "config", "--rewrite"]) == 0
    assert pinned.read_text().split() == resolved_ids("config")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=f"Compare the run ids of config/{{{','.join(CONFIGS)}}}.yaml with the "
        "pinned ones (exit 1 when they differ); --rewrite pins them."
    )
    parser.add_argument("--rewrite", action="store_true", help="write the resolved ids into the pinned files")
    parser.add_argument(
        "--pinned", type=Path, default=PINNED, help=f"the folder of the pinned files (default {PINNED})"
    )
    parser.add_argument("--config", action="append", choices=CONFIGS, help="only this config (repeatable)")
    args = parser.parse_args(argv)
    status = 0
    for name in args.config or CONFIGS:
        ids, path = resolved_ids(name), args.pinned / f"run_ids_{name}.txt"
        if args.rewrite:
            path.write_text("\n".join(ids) + "\n")
            print(f"{name}: {len(ids)} ids pinned in {path}")
            continue
        pinned = path.read_text().split() if path.is_file() else []
        new, gone = sorted(set(ids) - set(pinned)), sorted(set(pinned) - set(ids))
        if ids != pinned:
            status = 1
            print(f"{name}: differs from {path} (nothing written; --rewrite pins it): +{new} -{gone}")
        else:
            print(f"{name}: {len(ids)} ids, as pinned")
    return status


if __name__ == "__main__":
    sys.exit(main())
