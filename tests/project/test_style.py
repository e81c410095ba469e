"""The tree keeps the style its tools check (docs/testing.md#style): `ruff format --check` and `ruff check`
with the settings of pyproject.toml's [tool.ruff], over the whole repository, as CI runs them through
the README's test command. Without ruff in the environment the tests are skipped, and fail under CI."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ..conftest import require

REPO = Path(__file__).resolve().parents[2]
#: the Python folders ruff must see (an exclude that hid one would let it drift unchecked)
CODE_FOLDERS = ("src", "tests", "benchmarks", "workflow/scripts")
#: what the formatter leaves alone: the file its generator writes (`python -m dmlrepro.losses.catalog --write`)
#: and the docs' hand-aligned snippets
NOT_FORMATTED = ["src/dmlrepro/loss_catalog.py", "*.md"]


@pytest.fixture(scope="module")
def ruff():
    """Runs `python -m ruff ARGS` in the repository root (no cache: tests write nothing there)."""
    require(
        None
        if importlib.util.find_spec("ruff")
        else "ruff is not installed in this environment (it is in requirements.lock: ./setup.sh)"
    )

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "ruff", *args, "--no-cache"], cwd=REPO, capture_output=True, text=True
        )

    return run


def _shown(done: subprocess.CompletedProcess) -> set[str]:
    return {Path(line).resolve().relative_to(REPO).as_posix() for line in done.stdout.splitlines() if line}


def _python_files() -> set[str]:
    return {p.relative_to(REPO).as_posix() for folder in CODE_FOLDERS for p in (REPO / folder).rglob("*.py")}


def test_the_tree_is_formatted(ruff):
    done = ruff("format", "--check", "--output-format", "concise", ".")
    assert done.returncode == 0, f"run `.venv/bin/ruff format` (files it would change):\n{done.stdout}{done.stderr}"


def test_the_tree_passes_the_lint_rules(ruff):
    done = ruff("check", "--output-format", "concise", ".")
    assert done.returncode == 0, f"`.venv/bin/ruff check --fix` fixes those marked [*]:\n{done.stdout}{done.stderr}"


def test_ruff_sees_every_python_file(ruff):
    assert _python_files() - _shown(ruff("check", "--show-files", ".")) == set()
    ruff_settings = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]
    assert not {"exclude", "extend-exclude"} & set(ruff_settings), "exclude files from single rules or the formatter"
    assert ruff_settings["format"]["exclude"] == NOT_FORMATTED
