"""The workflow's run table and results layout (dmlrepro.run_table, docs/workflow.md#the-run-table):
one table of runs, searches and final-stage runs; the schema as the only place of the workflow
config's defaults; every output path defined once."""

import copy
import re
from pathlib import Path

import pytest
import yaml

from dmlrepro.run_table import ResultsLayout, RunTable, reported_tables
from dmlrepro.runs import SCHEMA, ExperimentError, resolve_runs, with_schema_defaults
from dmlrepro.train.state import RunDir
from dmlrepro.tuning.bayes import BEST_JSON, TRIALS_CSV
from dmlrepro.tuning.final import COMPLETE_KEY

ROOT = Path(__file__).resolve().parents[2]
SPACE = {"optimizer.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}
CONFIG = {
    "data_root": "data",
    "results": "results",
    "defaults": {
        "epochs": 4,
        "model": {"backbone": "tiny_cnn", "embedding_size": 16},
        "validation": {"split": "fold", "n_folds": 4, "scheme": "mlrc"},
    },
    "datasets": {"synthetic": {"dataset": {"name": "synthetic"}}, "digits": {"dataset": {"name": "digits"}}},
    "methods": {
        "pfml": {"loss": {"name": "pfml", "hparams": {"alpha": 4.0}}},
        "pa": {"loss": {"name": "proxy_anchor"}},
    },
    "experiments": {
        "table": {"methods": ["pfml", "pa"], "datasets": ["synthetic", "digits"], "metrics": ["recall@1"]},
        "reality": {
            "methods": ["pa"],
            "datasets": ["synthetic"],
            "metrics": ["map@r@separated"],
            "search": {"space": SPACE, "trials": 3, "folds": [0, 1]},
            "final": {"seeds": [0, 1], "complete": {"validation": {"split": None}}},
        },
    },
}


def test_one_table_holds_the_runs_the_searches_and_the_final_stage_as_it_becomes_known():
    table = RunTable(CONFIG)
    assert table.experiments == ["table", "reality"]
    assert len(table.runs) == 2 * 2 and [r.method for r in table.experiment_runs("table")] == ["pfml"] * 2 + ["pa"] * 2
    (search,) = table.experiment_searches("reality")
    assert table.trained(search.run_id) is search and not table.experiment_runs("reality")
    assert table.search_spec(search.run_id)["space"] == SPACE and table.search_spec(search.run_id)["folds"] == [0, 1]
    assert table.dataset_params == {"synthetic": {}, "digits": {}}
    # before the search has its best point: no final run; then the fold runs (seeds × folds); then the Complete runs
    assert table.final_runs("reality", best=lambda s: None, epochs=lambda s: None) == {}
    best = {"params": {"optimizer.lr": 3e-3}}
    folds = table.final_runs("reality", best=lambda s: best, epochs=lambda s: None)
    assert len(folds) == 2 * 2 and set(folds) <= set(table.runs)
    assert all(run.config["optimizer"]["lr"] == 3e-3 for run in folds.values())
    everything = table.final_runs("reality", best=lambda s: best, epochs=lambda s: {"epochs": 5, "followup_epochs": 0})
    complete = [run for run in table.experiment_runs("reality") if run.experiments["reality"].get(COMPLETE_KEY)]
    assert len(everything) == 2 * 2 + 2 and len(complete) == 2 and all(r.config["epochs"] == 5 for r in complete)
    assert table.final_runs("table", best=lambda s: best, epochs=lambda s: None) == {}  # no final stage


def test_the_table_is_what_the_per_kind_builders_give():
    table = RunTable(CONFIG)
    assert list(table.runs) == list(resolve_runs(CONFIG))
    assert len(table.example_final_runs("reality")) == 2 * 2 + 2  # the preflight's stand-ins: folds and Complete


def test_the_schema_is_the_one_place_of_the_defaults(tmp_path):
    """An experiment without `seeds` trains seed 0, a final stage without `seeds` reproduces seed 0 and
    rounds to 5 epochs, `opt_in` is off (docs/workflow.md#config, docs/tuning.md): all read from the
    schema; a schema with other defaults gives other runs, and the caller's config is left as it was."""
    config = copy.deepcopy(CONFIG)
    del config["experiments"]["reality"]["final"]["seeds"]
    before = copy.deepcopy(config)
    filled = with_schema_defaults(config)
    assert filled["experiments"]["table"]["seeds"] == [0] and filled["experiments"]["table"]["opt_in"] is False
    assert filled["experiments"]["reality"]["final"]["seeds"] == [0]
    assert filled["experiments"]["reality"]["final"]["round_epochs"] == 5
    assert filled["experiments"]["reality"]["search"]["folds"] == [0, 1]  # a value given stays
    assert filled["opt_in"] == [] and filled["title"] == "dmlrepro report" and filled["job_server"] is True
    assert config == before
    schema = yaml.safe_load(SCHEMA.read_text())
    schema["properties"]["experiments"]["additionalProperties"]["properties"]["seeds"]["default"] = [3]
    other = tmp_path / "schema.yaml"
    other.write_text(yaml.safe_dump(schema))
    assert {run.seed for run in resolve_runs(with_schema_defaults(config, other)).values()} == {3}
    assert {run.seed for run in resolve_runs(config).values()} == {0}


def test_the_workflow_validation_fills_the_same_defaults():
    """Snakemake's validate (what common.smk runs) and with_schema_defaults agree on every shipped config."""
    from snakemake.utils import validate

    for name in ("config", "miniature"):
        config = yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())
        validated = copy.deepcopy(config)
        validate(validated, str(SCHEMA))
        assert with_schema_defaults(config) == validated


def test_results_layout_is_the_documented_one():
    """The paths of docs/workflow.md's output table."""
    layout = ResultsLayout("results", "data")
    assert layout.run_file("r1", RunDir.METRICS) == "results/runs/r1/metrics.json"
    assert layout.search_file("s1", BEST_JSON) == "results/search/s1/best.json"
    assert layout.search_file("s1", TRIALS_CSV) == "results/search/s1/trials.csv"
    assert layout.final_epochs("e", "s1") == "results/final/e/s1/epochs.json"
    assert layout.experiment_table("e") == "results/experiments/e.csv"
    assert layout.experiment_seeds("e") == "results/experiments/seeds/e.csv"
    assert layout.report_section("e") == "results/sections/e"
    assert layout.report("index.html") == "results/report/index.html" and layout.report_dir() == "results/report"
    assert (
        layout.log("train", "r1") == "results/logs/train/r1.log" and layout.log("report") == "results/logs/report.log"
    )
    assert layout.manifest("digits") == "data/digits/manifest.csv"
    assert layout.run_file("{run}", RunDir.TRAIN_LOG) == "results/runs/{run}/train_log.csv"  # a rule's pattern


def test_the_rules_spell_no_results_path():
    """Rules only wire: every results path comes from ResultsLayout (none written out in a rule file)."""
    # (a path relative to the rule file, "../report/<caption>.rst", is no results path)
    spelt = re.compile(r"RESULTS\}|/runs/|/search/|/logs/|/experiments/|/sections/|(?<!\.\.)/report/")
    for path in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        code = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in code if spelt.search(line)], path.name


def test_a_missing_reported_table_is_one_line_naming_the_key(tmp_path):
    (tmp_path / "pfml_table1.csv").write_text("method\n")
    assert reported_tables({"report": {"reported": "pfml_table1"}}, "t", str(tmp_path)) == [
        f"{tmp_path}/pfml_table1.csv"
    ]
    assert reported_tables({"report": {"kind": "table"}}, "t", str(tmp_path)) == []
    with pytest.raises(
        ExperimentError,
        match=r"^config experiments\.t\.report\.reported = 'pfml_table9': "
        r"expected one of \['pfml_table1'\]$",
    ):
        reported_tables({"report": {"reported": "pfml_table9"}}, "t", str(tmp_path))
