"""Both configs resolve to the run ids pinned in tests/config/pinned/: a refactoring that changes a run's identity
fails here. A deliberate change of an experiment (a new recipe, a new run) rewrites the pinned list:
`python tests/config/test_run_ids_pinned.py` (and say in the commit which ids changed and why)."""
from pathlib import Path

import yaml
from snakemake.utils import validate

from dmlrepro.runs import resolve_runs
from dmlrepro.tuning.searches import search_runs

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).with_name("pinned")
CONFIGS = ("config", "paper")


def resolved_ids(name: str) -> list[str]:
    """The run and search ids of config/NAME.yaml as the workflow resolves them (schema defaults applied)."""
    config = yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())
    validate(config, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    return sorted(resolve_runs(config)) + sorted(search_runs(config))


def test_default_config_run_ids_are_pinned():
    assert resolved_ids("config") == (PINNED / "run_ids_config.txt").read_text().split()


def test_paper_config_run_ids_are_pinned():
    assert resolved_ids("paper") == (PINNED / "run_ids_paper.txt").read_text().split()


if __name__ == "__main__":
    for config_name in CONFIGS:
        ids = resolved_ids(config_name)
        (PINNED / f"run_ids_{config_name}.txt").write_text("\n".join(ids) + "\n")
        print(f"{config_name}: {len(ids)} ids pinned")
