"""Every shell command in README.md and docs/ works as written (docs/testing.md#the-docs-commands).

The commands are the lines of the ```bash / ```sh blocks (continuation lines joined, `&&` split,
comments, VAR=value prefixes and `nice -n N` dropped). Each is checked without doing its work:

* `snakemake …`: snakemake's own parsing (profiles included; every --configfile exists, so no target
  was read as a config file), then a dry run of its targets, batched: one `snakemake -n` per
  workflow config and --config, with every target the docs ask of it (test marked slow);
* `dmlrepro COMMAND …`, `python -m MODULE …`, `python SCRIPT …`: the command's argparse parser on its
  arguments, stopped once they parse (nothing runs).

A block's commands that need a cluster, a GPU, data, or that set up or test the checkout itself are
skipped by a marker line right above the block naming them, e.g.
``<!-- doc-commands: skip ./setup.sh, pytest (set up and test the checkout) -->``: a command containing
one of the names is not run. A command of any other program, unmarked, fails here.
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"^[ \t]*(?:<!-- doc-commands: skip ([^(>\n]*)[^\n]*-->\n[ \t]*)?```(?:bash|sh|shell)\n(.*?)^[ \t]*```", re.S | re.M
)
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def doc_commands() -> list[tuple[str, str, bool, dict]]:
    """(where, command, skipped, environment) for every command line of the docs' shell blocks; the
    environment: the block's `export VAR=value` lines before the command."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            skip = [name.strip() for name in (match.group(1) or "").split(",") if name.strip()]
            line_no, env = text[: match.start(2)].count("\n") + 1, {}
            for line in match.group(2).replace("\\\n", " ").splitlines():
                line = re.split(r"\s#", line, maxsplit=1)[0].strip()
                for command in filter(None, (part.strip() for part in line.split("&&"))):
                    if command.startswith("export "):
                        env.update(word.split("=", 1) for word in shlex.split(command)[1:])
                    elif not command.startswith("#"):
                        where = f"{doc.relative_to(ROOT)}:{line_no}"
                        out.append((where, command, any(name in command for name in skip), dict(env)))
    return out


COMMANDS = doc_commands()


def words(command: str) -> list[str]:
    """The command's words without VAR=value prefixes and `nice -n N`."""
    parts = shlex.split(command)
    while parts and ENV.match(parts[0]):
        parts.pop(0)
    if parts[:2] == ["nice", "-n"]:
        parts = parts[3:]
    return parts


def program(parts: list[str]) -> str:
    return Path(parts[0]).name


class Parsed(Exception):
    """Raised by the patched ArgumentParser.parse_args once the arguments parse."""


def parse_only(monkeypatch, run) -> None:
    """Run `run` with argparse stopping once the outermost parser has parsed (parse_args or
    parse_known_args); a parse error fails the test. No process can start meanwhile."""
    parse_known, depth = argparse.ArgumentParser.parse_known_args, [0]

    def parse(self, args, namespace):
        depth[0] += 1
        try:
            return parse_known(self, args, namespace)
        finally:
            depth[0] -= 1

    def parse_known_args(self, args=None, namespace=None):
        result = parse(self, args, namespace)
        if depth[0] == 0:
            raise Parsed(result)
        return result

    def parse_args(self, args=None, namespace=None):
        namespace, extras = parse(self, args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        raise Parsed(namespace)

    def no_process(*args, **kwargs):
        raise AssertionError(f"the command started a process before parsing its arguments: {args[:1]}")

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    try:
        run()
    except Parsed:
        return
    except SystemExit as exit:  # --help exits 0; a parse error exits 2 after printing it
        assert exit.code in (0, None), f"exit {exit.code}"
        return
    pytest.fail("the command ran without parsing its arguments with argparse")


def snakemake_args(parts: list[str]):
    from snakemake.cli import parse_args

    return parse_args(parts[1:])[1]


@pytest.mark.parametrize(
    "where, command",
    [(w, c) for w, c, skipped, _ in COMMANDS if not skipped],
    ids=[w for w, _, s, _ in COMMANDS if not s],
)
def test_the_command_parses(where, command, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the docs run every command from the repository root
    parts = words(command)
    name = program(parts)
    try:
        if name == "snakemake":
            args = snakemake_args(parts)
            missing = [str(f) for f in args.configfile or () if not Path(f).is_file()]
            assert not missing, f"--configfile {missing}: no such file (a target after --configfile is read as one)"
        elif name == "dmlrepro":
            from dmlrepro.cli import main

            parse_only(monkeypatch, lambda: main(parts[1:]))
        elif name.startswith("python") and parts[1:2] == ["-m"]:
            monkeypatch.setattr(sys, "argv", [parts[2], *parts[3:]])
            parse_only(monkeypatch, lambda: runpy.run_module(parts[2], run_name="__main__", alter_sys=True))
        elif name.startswith("python"):
            monkeypatch.setattr(sys, "argv", parts[1:])
            parse_only(monkeypatch, lambda: runpy.run_path(parts[1], run_name="__main__"))
        else:
            pytest.fail(f"{name}: not a command this test checks; mark the block (module docstring)")
    except (AssertionError, pytest.fail.Exception) as error:
        err = " ".join(line for line in capsys.readouterr().err.splitlines() if "error" in line.lower())
        pytest.fail(f"{where}: `{command}`: {error} {err}")


def dry_run_groups() -> dict[tuple, list[str]]:
    """(configfiles, --config entries, environment) -> every target the docs' snakemake commands ask of it."""
    groups: dict[tuple, list[str]] = {}
    for _, command, skipped, env in COMMANDS:
        parts = words(command)
        if skipped or program(parts) != "snakemake":
            continue
        args = snakemake_args(parts)
        key = (tuple(str(f) for f in args.configfile or ()), tuple(args.config or ()), tuple(sorted(env.items())))
        targets = groups.setdefault(key, [])
        targets += [t for t in args.targets or ["all"] if t not in targets]
    return groups


@pytest.mark.slow  # one snakemake dry run per workflow config: about 5 CPU-seconds each
def test_every_snakemake_target_of_the_docs_dry_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    groups = dry_run_groups()
    assert len(groups) >= 3, groups  # the default, config/paper.yaml and a selection at least
    for (configfiles, config, env), targets in groups.items():
        command = [str(SNAKEMAKE), "-n", "--cores", "1", *targets]
        command += (["--configfile", *configfiles] if configfiles else []) + (["--config", *config] if config else [])
        environ = {**os.environ, **dict(env)}
        done = subprocess.run(
            [*command, "--quiet", "rules"], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{shlex.join(command)}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"


def test_every_doc_block_is_found_and_markers_name_commands():
    assert len(COMMANDS) > 20
    skipped = [c for _, c, s, _ in COMMANDS if s]
    assert any("setup.sh" in c for c in skipped) and not any(c.startswith("dmlrepro plan") for c in skipped)
