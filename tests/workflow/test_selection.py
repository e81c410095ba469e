"""What the workflow builds from a config and a selection (dmlrepro.selection, docs/workflow.md#targets):
a dataset that cannot be prepared, or is not selected, leaves out only the runs on it, each experiment
keeps its other datasets, and no run's identity changes; `dmlrepro plan` counts the jobs a target asks for."""

import json
from pathlib import Path

import pytest
import yaml

from dmlrepro import plan
from dmlrepro.data.prepared import ARCHIVE_DIR
from dmlrepro.run_table import RunTable
from dmlrepro.runs import ExperimentError
from dmlrepro.selection import (
    DOWNLOAD,
    GENERATED,
    MANUAL,
    PLACED,
    PREPARED,
    DatasetStatus,
    dataset_status,
    select,
    target_scopes,
)

ROOT = Path(__file__).resolve().parents[2]
PAPER = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
PINNED_PAPER = (ROOT / "tests/config/pinned/run_ids_paper.txt").read_text().split()


def without(*absent):
    """A `status` under which the datasets `absent` cannot be prepared."""
    return lambda name: DatasetStatus(name, MANUAL, "fetch it") if name in absent else DatasetStatus(name, DOWNLOAD)


def test_a_manual_dataset_leaves_out_only_its_runs_and_no_run_id_changes():
    selection = select(PAPER, without("inshop", "cars196"))
    table = RunTable(selection.config, selection.experiments)
    ids = set(table.runs) | set(table.searches)
    assert ids < set(PINNED_PAPER)  # the same identities: the pinned ones, fewer of them
    datasets = {run.dataset for run in table.all_trained().values()}
    assert "inshop" not in datasets and "cars196" not in datasets and {"cub200", "sop"} <= datasets
    # ASAP Table 1 (CUB, Cars, In-Shop, SOP) is built on CUB and SOP and says what it lacks
    assert selection.config["experiments"]["asap_table1"]["datasets"] == ["cub200", "sop"]
    assert "asap_table1" in selection.experiments and "inshop" in selection.reasons["asap_table1"]
    # ASAP Table 2 (In-Shop, SOP) keeps SOP; PFML Supp. Table 3 (Cars alone) is not run, with the reason
    assert selection.config["experiments"]["asap_table2"]["datasets"] == ["sop"]
    assert "pfml_supp_table3_mlrc" not in selection.experiments
    assert selection.reasons["pfml_supp_table3_mlrc"] == "cars196: not prepared, fetch it"
    # published-only sections (no dataset) stay
    assert "rsw_table5_face" in selection.experiments


def test_every_dataset_preparable_is_the_whole_pinned_table():
    selection = select(PAPER, without())
    table = RunTable(selection.config, selection.experiments)
    assert sorted(set(table.runs) | set(table.searches)) == sorted(PINNED_PAPER) and not selection.reasons


def test_only_datasets_selects_and_says_why_the_rest_is_not_run():
    selection = select({**PAPER, "only_datasets": ["sop"]}, without())
    assert selection.config["experiments"]["pfml_table1_sop"]["datasets"] == ["sop"]
    assert "pfml_table1" not in selection.experiments
    assert "not selected (config only_datasets = [sop])" in selection.reasons["pfml_table1"]
    with pytest.raises(ExperimentError, match="only_datasets: 'imagenet'"):
        select({**PAPER, "only_datasets": ["imagenet"]}, without())


def test_not_run_entries_are_what_the_report_takes():
    selection = select(PAPER, without("inshop"))
    rows = selection.not_run(["asap_table2", "pfml_table1"])
    assert rows == [{"experiment": "asap_table2", "reason": selection.reasons["asap_table2"]}]


def test_targets_are_papers_and_experiments_but_not_a_rule_name():
    scopes = target_scopes(["pfml_table1", "rsw_table2", "asap_table1", "other", "search"], reserved=["search"])
    assert scopes["pfml"] == ["pfml_table1"] and scopes["asap"] == ["asap_table1"] and scopes["other"] == ["other"]
    assert "search" not in scopes  # an experiment named like a rule: built by `all`, no target of its own
    assert target_scopes(["rsw"]) == {"rsw": ["rsw"]}  # one named like a paper: that paper's target


def test_dataset_status_reads_the_data_folder(tmp_path):
    root = str(tmp_path)
    assert dataset_status("synthetic", root).status == GENERATED
    assert dataset_status("cub200", root).status == DOWNLOAD  # a download URL
    cars = dataset_status("cars196", root)
    assert cars.status == MANUAL and not cars.usable and f"{tmp_path}/cars196/{ARCHIVE_DIR}" in cars.fetch
    folder = tmp_path / "cars196" / ARCHIVE_DIR
    folder.mkdir(parents=True)
    (folder / "car_ims.tgz").touch()
    assert dataset_status("cars196", root).status == MANUAL  # cars_annos.mat still missing
    (folder / "cars_annos.mat").touch()
    assert dataset_status("cars196", root).status == PLACED
    (tmp_path / "cub200").mkdir()
    (tmp_path / "cub200" / "manifest.csv").touch()
    assert dataset_status("cub200", root).status == PREPARED


def test_plan_counts_every_pinned_job_and_its_requested_hours(tmp_path):
    config = {**PAPER, "data_root": str(tmp_path)}  # nothing prepared: Cars-196 and In-Shop manual
    doc = plan.make_plan(config)
    assert sorted(row["run_id"] for row in doc["jobs"]) == sorted(PINNED_PAPER)
    requests = PAPER["resources"]["train"]
    # a PFML SOP job asks SOP's runtime with the default's GPUs (config/paper.yaml resources.train)
    sop = next(row for row in doc["jobs"] if row["experiment"] == "pfml_table1_sop")
    assert sop["runtime_min"] == requests["sop"]["runtime"] and sop["gpus"] == requests["default"]["gpu"]
    assert doc["gpu_hours"] == pytest.approx(sum(p["gpu_hours"] for p in doc["papers"]))
    status = {d["dataset"]: d["status"] for d in doc["datasets"]}
    assert status["inshop"] == MANUAL and status["cars196"] == MANUAL and status["cub200"] == DOWNLOAD
    assert doc["now"]["jobs"] == sum(row["dataset"] not in ("inshop", "cars196") for row in doc["jobs"])
    assert json.loads(json.dumps(doc)) == doc


def test_plan_of_a_paper_with_a_preflight(tmp_path, capsys):
    config = tmp_path / "paper.yaml"
    config.write_text(yaml.safe_dump({**PAPER, "data_root": str(tmp_path)}))
    rsw = plan.make_plan({**PAPER, "data_root": str(tmp_path)}, ["rsw"])
    over = rsw["jobs"][0]["run_id"]
    preflight = tmp_path / "preflight.json"
    preflight.write_text(
        json.dumps(
            {
                "experiments": [{"name": "rsw_table1", "runs": [], "hours": 12.5}],
                "total_hours": 12.5,
                "over_budget": [over],
            }
        )
    )
    assert plan.main(["rsw", "--configfile", str(config), "--preflight", str(preflight), "--experiments"]) == 0
    screen = capsys.readouterr().out
    assert "over budget (preflight): 1 run(s)" in screen and over in screen
    assert "rsw_table1 " in screen and " 12" in screen.split("rsw_table1 ", 2)[-1].splitlines()[0]
    assert len(screen.splitlines()) < 60  # one screen
    assert plan.main(["nope", "--configfile", str(config)]) == 2
    assert "unknown target 'nope'" in capsys.readouterr().err


def test_plan_projects_hours_per_dataset_from_the_preflights_runs(tmp_path, capsys):
    """The preflight's hours per run (`run_hours`) add up per dataset, each job once."""
    config = {**PAPER, "data_root": str(tmp_path)}
    rows = plan.make_plan(config, ["rsw"])["jobs"]
    cub = [row["run_id"] for row in rows if row["dataset"] == "cub200"]
    sop = next(row["run_id"] for row in rows if row["dataset"] == "sop")
    run_hours = {cub[0]: 1.5, cub[1]: 2.0, sop: 7.0, "another-config-run": 100.0}
    preflight = {"experiments": [], "total_hours": 110.5, "over_budget": [], "run_hours": run_hours}
    by_dataset = {e["dataset"]: e["projected_hours"] for e in plan.make_plan(config, ["rsw"], preflight)["by_dataset"]}
    assert by_dataset["cub200"] == pytest.approx(3.5) and by_dataset["sop"] == pytest.approx(7.0)
    assert by_dataset["cars196"] is None  # no run of it projected
    old = {k: v for k, v in preflight.items() if k != "run_hours"}  # a preflight JSON from before run_hours
    assert all(e["projected_hours"] is None for e in plan.make_plan(config, ["rsw"], old)["by_dataset"])


def test_plan_of_a_search_asks_its_trials_times_folds(tmp_path):
    """RSW's reality check on CUB (opt-in): each search job trains 50 trials x 4 folds in one allocation,
    12,000 minutes at CUB's 60 (docs/slurm.md); its final stage is counted at the space's example point."""
    config = {**PAPER, "data_root": str(tmp_path), "opt_in": ["rsw_reality_cub"]}
    doc = plan.make_plan(config, ["rsw_reality_cub"])
    spec = PAPER["experiments"]["rsw_reality_cub"]["search"]
    searches = [row for row in doc["jobs"] if row["runs"] > 1]
    assert searches and all(row["runs"] == spec["trials"] * len(spec["folds"]) == 200 for row in searches)
    assert all(row["runtime_min"] == 12_000 for row in searches)
    finals = [row for row in doc["jobs"] if row["runs"] == 1]
    assert len(finals) > 0 and doc["papers"][0]["runs"] == 200 * len(searches) + len(finals)
