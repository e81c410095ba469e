"""`dmlrepro runs` checks the workflow config against workflow/schemas/config.schema.yaml, as the
workflow's common.smk does, before it resolves the runs."""

from pathlib import Path

import yaml

from dmlrepro.runs import main

TINY = Path(__file__).resolve().parents[2] / "tests" / "workflow" / "tiny.yaml"


def _write(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_runs_lists_the_runs_of_a_valid_config(tmp_path, capsys):
    assert main(["--config", _write(tmp_path, yaml.safe_load(TINY.read_text()))]) == 0
    assert capsys.readouterr().out.rstrip().endswith(" runs")


def test_runs_refuses_a_config_the_schema_refuses(tmp_path, capsys):
    config = yaml.safe_load(TINY.read_text())
    del config["experiments"]["alpha"]["report"]["x"]  # a sweep report needs its x key
    assert main(["--config", _write(tmp_path, config)]) == 2
    out = capsys.readouterr().out
    assert "experiments.alpha.report: 'x' is a required property" in out and out.count("\n") == 1  # not the schema


def test_an_empty_opt_in_group_is_refused(tmp_path, capsys):
    """`opt_in: ""` would read as not opt-in (an empty string is false): the schema asks for a name."""
    config = yaml.safe_load(TINY.read_text())
    config["experiments"]["alpha"]["opt_in"] = ""
    assert main(["--config", _write(tmp_path, config)]) == 2
    assert "experiments.alpha.opt_in: '' should be non-empty" in capsys.readouterr().out
    config["experiments"]["alpha"]["opt_in"] = "arms"  # a group's name
    assert main(["--config", _write(tmp_path, config)]) == 0


def test_runs_names_a_missing_schema(tmp_path, capsys):
    config = _write(tmp_path, yaml.safe_load(TINY.read_text()))
    assert main(["--config", config, "--schema", str(tmp_path / "none.yaml")]) == 2
    assert "workflow config schema not found" in capsys.readouterr().out
