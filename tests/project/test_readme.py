"""README.md is a landing page (docs/testing.md): the two commands a newcomer needs come first, it stays
short, and it carries no history: no commit hashes or dated measurements (those live in
docs/benchmarks.md and the commit messages)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# a word of 7 to 40 hex digits with at least one digit and one letter: how a commit is cited
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def test_the_first_block_sets_up_runs_and_tests():
    first = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert first[0].startswith("./setup.sh && .venv/bin/snakemake --cores all")
    assert first[1].startswith(".venv/bin/python -m pytest")
    assert README.index("```bash") < README.index("\n## ")  # before any section


def test_short():
    assert len(README.splitlines()) <= 150


def test_no_commit_hashes_or_dates():
    assert not COMMIT.findall(README)
    assert not DATE.findall(README)
