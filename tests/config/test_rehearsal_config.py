"""config/rehearsal.yaml over config/paper.yaml (docs/slurm.md#rehearse-your-cluster-run): PFML Table 1 on
CUB only, small CPU runs that need no weights, data and results apart from the paper's; without a cluster
(tests/integration/test_slurm_rehearsal.py runs it through SLURM)."""

from __future__ import annotations

from pathlib import Path

import yaml

from dmlrepro.plan import main as plan_main, make_plan, merged_configs
from dmlrepro.run_table import RunTable
from dmlrepro.selection import assume_preparable, select

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = [str(ROOT / "config/paper.yaml"), str(ROOT / "config/rehearsal.yaml")]


def test_the_overlay_merges_key_by_key_as_snakemake_does():
    paper, overlay = (yaml.safe_load(Path(path).read_text()) for path in CONFIGS)
    merged = merged_configs(CONFIGS)
    assert merged["experiments"]["pfml_table1"]["seeds"] == [0]
    assert merged["experiments"]["pfml_table1"]["methods"] == paper["experiments"]["pfml_table1"]["methods"]
    assert merged["defaults"]["optimizer"] == paper["defaults"]["optimizer"]  # untouched keys stay the paper's
    assert merged["resources"]["train"]["cub200"]["runtime"] == overlay["resources"]["train"]["cub200"]["runtime"]
    assert (merged["data_root"], merged["results"]) != (paper["data_root"], paper["results"])


def test_the_rehearsal_plans_two_small_cpu_jobs_on_cub(tmp_path):
    config = {**merged_configs(CONFIGS), "data_root": str(tmp_path)}
    plan = make_plan(config, ["pfml_table1"])
    assert [(job["dataset"], job["gpus"], job["runtime_min"]) for job in plan["jobs"]] == [("cub200", 0, 10)] * 2
    assert plan["datasets"] == [{"dataset": "cub200", "status": "download", "fetch": ""}]
    assert plan["not_run"] == [
        {
            "experiment": "pfml_table1",
            "reason": "built without cars196 (cars196: not selected (config only_datasets = [cub200]))",
        }
    ]
    selected = select(config, assume_preparable)
    runs = RunTable(selected.config, ["pfml_table1"]).experiment_runs("pfml_table1")
    assert sorted(run.method for run in runs) == ["cpml", "pfml"]
    for run in runs:
        model, dataset = run.config["model"], run.config["dataset"]
        assert (model["backbone"], model["pretrained"], dataset["image_size"]) == ("tiny_cnn", False, 32)
        assert (run.config["epochs"], run.config["steps_per_epoch"], run.seed) == (2, 1, 0)


def test_plan_takes_several_configfiles(capsys):
    assert plan_main(["pfml_table1", "--configfile", *CONFIGS]) == 0
    screen = capsys.readouterr().out
    assert screen.startswith(f"plan of pfml_table1 --configfile {' '.join(CONFIGS)} (only_datasets: cub200)")
    assert "2 training jobs, 2 runs, 0 GPU-hours requested" in screen
