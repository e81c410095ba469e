"""The SLURM profile and its documentation against the installed snakemake and SLURM plugin, without a
cluster: every key of slurm/config.yaml is an option they accept (a misspelt key would only stop the
user's first `snakemake --profile slurm`), the profile table of docs/slurm.md names every key, and every
`snakemake` command line and `--slurm-…` option docs/slurm.md shows is one they accept."""

from __future__ import annotations

import re
import shlex
from dataclasses import MISSING
from pathlib import Path

import pytest
import yaml
from snakemake.cli import parse_args

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "slurm"
DOC = ROOT / "docs" / "slurm.md"
CODE_BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)
SLURM_OPTION = re.compile(r"(?<![\w-])--slurm-[a-z-]+")


def parsed(argv: list[str], capsys) -> object:
    """snakemake's own command-line parsing (profiles included); a refused option fails the test with
    snakemake's message, not its SystemExit."""
    try:
        return parse_args(argv)[1]
    except SystemExit:
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        pytest.fail(f"snakemake {shlex.join(argv)}: {' '.join(errors)}")


def profile_keys() -> list[str]:
    return list(yaml.safe_load((PROFILE / "config.yaml").read_text(encoding="utf-8")))


def doc_commands() -> list[str]:
    """The `snakemake …` lines of docs/slurm.md's bash blocks, continuation lines joined, comments cut."""
    commands = []
    for block in CODE_BLOCK.findall(DOC.read_text(encoding="utf-8")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("snakemake "):
                commands.append(line)
    return commands


def test_every_profile_key_is_an_option_snakemake_and_the_plugin_accept(capsys):
    args = parsed(["--profile", str(PROFILE), "--workflow-profile", "none"], capsys)
    assert args.executor == "slurm"
    assert args.slurm_efficiency_report is True  # docs/slurm.md#job-arrays-and-the-efficiency-report
    assert args.slurm_array_jobs in (None, MISSING)  # arrays stay off (unset plugin settings are MISSING)


def test_the_profile_table_names_every_key():
    section = DOC.read_text(encoding="utf-8").split("## The profile\n", 1)[1].split("\n## ", 1)[0]
    named = {key for row in section.splitlines() if row.startswith("| `") for key in re.findall(r"`([\w-]+)`", row)}
    missing = [key for key in profile_keys() if key not in named]
    assert not missing, f"slurm/config.yaml keys missing from the profile table of docs/slurm.md: {missing}"


@pytest.mark.parametrize("command", doc_commands())
def test_every_snakemake_command_the_doc_shows_is_accepted(command, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # `--profile slurm` is the folder beside the Snakefile, as the doc runs it
    parsed(shlex.split(command)[1:], capsys)


def test_every_slurm_option_the_doc_names_is_accepted(capsys):
    options = sorted(set(SLURM_OPTION.findall(DOC.read_text(encoding="utf-8"))))
    assert "--slurm-array-jobs" in options and "--slurm-efficiency-threshold" in options, options
    known = parsed(["--workflow-profile", "none"], capsys)
    unknown = [option for option in options if not hasattr(known, option[2:].replace("-", "_"))]
    assert not unknown, f"docs/slurm.md names options the installed plugins do not have: {unknown}"
