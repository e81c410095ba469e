"""The top-level `dmlrepro` command dispatches to the subpackages' front ends."""

import argparse
import inspect
import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from dmlrepro.cli import COMMANDS, main
from dmlrepro.losses import LOSS_NAMES


def test_help_lists_every_command(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)


def test_unknown_command_fails_with_usage(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_losses_lists_every_loss(capsys):
    assert main(["losses"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line and not line.startswith(" ")}
    assert listed == set(LOSS_NAMES)


def test_datasets_passes_arguments_through(capsys, tmp_path):
    assert main(["datasets", "--root", str(tmp_path)]) == 0
    assert "synthetic" in capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - {"losses"}))
def test_each_commands_help_names_the_command_a_user_types(command, capsys):
    """`dmlrepro COMMAND --help` prints `usage: dmlrepro COMMAND`, the command that works, not a front end's own."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    usage = " ".join(capsys.readouterr().out.split())
    assert usage.startswith(f"usage: dmlrepro {command} "), usage[:120]


# -- issue: the papercuts a new user meets ------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_installed_packages(capsys):
    assert main(["--version"]) == 0
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"dmlrepro {metadata.version('dmlrepro')}\n" == f"dmlrepro {pyproject}\n"


def _entries(out: str) -> dict[str, list[str]]:
    """`dmlrepro losses` output: loss -> its lines (the first holds the paper)."""
    entries: dict[str, list[str]] = {}
    for line in out.splitlines():
        if not line.startswith(" "):
            name, _, paper = line.partition(" ")
            entries[name] = [paper.strip()]
        else:
            entries[name].append(line.strip())
    return entries


def test_losses_says_each_losses_paper_origin_and_defaults(capsys):
    assert main(["losses"]) == 0
    entries = _entries(capsys.readouterr().out)
    # origins as the modules' sources say: HIST ports github.com/ljin0429/HIST; the baselines are PML's
    assert entries["hist"][1] == "a port of the paper's official code"
    assert entries["pfml"][1] == entries["rsw"][1] == entries["asap_c2"][1] == "written from the paper"
    assert entries["proxy_anchor"][1] == "a library's implementation (pytorch-metric-learning ProxyAnchorLoss)"
    assert "Potential Field Based Deep Metric Learning" in entries["pfml"][0]
    assert "Realigned Softmax Warping" in entries["rsw"][0]
    # defaults: Proxy Anchor's δ = 0.1, α = 32 (Kim et al. 2020, Sec. 4); RSW's CUB phase 1 (the official code)
    assert "margin=0.1" in entries["proxy_anchor"][2] and "alpha=32" in entries["proxy_anchor"][2]
    assert all(f"{key}={value}" in entries["rsw"][2] for key, value in {"alpha": 28.4, "k1": 0.93, "k2": 1.15}.items())
    assert all(lines[2].startswith("defaults: ") for lines in entries.values())
    # a builder taking **hparams (ASAP's, XBM's) shows the defaults of the class it returns
    from dmlrepro.losses import ASAPLoss

    asap = {k: v.default for k, v in inspect.signature(ASAPLoss).parameters.items() if k == "proxies_per_class"}
    assert f"proxies_per_class={asap['proxies_per_class']!r}" in entries["asap_c2"][2]


def test_losses_refuses_an_unknown_name(capsys):
    assert main(["losses", "pfmll"]) == 2
    assert "unknown loss 'pfmll'" in capsys.readouterr().err


def _parsers(command: str, monkeypatch) -> list[argparse.ArgumentParser]:
    """The argument parsers `dmlrepro COMMAND` builds, its sub-commands' included."""
    seen: list[argparse.ArgumentParser] = []

    def capture(self, args=None, namespace=None):
        seen.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(SystemExit):
        main([command])
    found = []
    while seen:
        parser = seen.pop()
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                seen.extend(action.choices.values())
    return found


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_and_argument_has_help(command, monkeypatch):
    parsers = _parsers(command, monkeypatch)
    assert parsers, f"dmlrepro {command} builds no argument parser"
    bare = [
        f"{parser.prog}: {'/'.join(action.option_strings) or action.dest}"
        for parser in parsers
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert bare == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_machine_path_in_help(command, capsys):
    """A default shown in help is what a user types (config/config.yaml), not where this checkout lies."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert str(ROOT) not in out and str(Path.home()) not in out


def test_messages_name_the_command_a_user_types():
    """`dmlrepro prepare`, not a module's own front end (`python -m dmlrepro.data.cli prepare`)."""
    fronts = re.compile(r"python -m dmlrepro\.(?:data|train|tuning|models|report)\.(?:cli|browser)\b")
    found = [
        f"{path.relative_to(ROOT)}: {match}"
        for path in sorted((ROOT / "src" / "dmlrepro").rglob("*.py"))
        for match in fronts.findall(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def test_runs_takes_configfile_and_keeps_config(capsys):
    """One spelling across the commands (`--configfile`, as snakemake, preflight, plan); `--config` still works."""
    assert main(["runs", "--configfile", str(ROOT / "config" / "config.yaml"), "--experiment", "pfml_table1"]) == 0
    new = capsys.readouterr().out
    assert main(["runs", "--config", str(ROOT / "config" / "config.yaml"), "--experiment", "pfml_table1"]) == 0
    assert capsys.readouterr().out == new and new.endswith(" runs\n")
    with pytest.raises(SystemExit):
        main(["runs", "--help"])
    assert "--config " not in capsys.readouterr().out.replace("--configfile", "")
