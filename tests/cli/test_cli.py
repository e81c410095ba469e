"""The top-level `dmlrepro` command dispatches to the subpackages' front ends."""

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
