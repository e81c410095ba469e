"""config/paper.yaml: the PFML paper's full settings (docs/paper-config.md).

The config must validate against the workflow schema, resolve to the run counts of the table in
docs/paper-config.md (a config edit that adds, drops or un-shares runs fails here), train only on
the real benchmarks at 224 px, and carry supp. Table 5's values — checked against the paper's own
transcription in config/reported/pfml_supp_table5.csv, not against the config's text.
"""

import copy
import csv
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from dmlrepro.runs import experiment_runs, resolve_runs

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "paper.yaml"
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
REAL = {"cub200", "cars196", "sop"}
PRINTED = {"cub200": "CUB-200-2011", "cars196": "Cars-196", "sop": "SOP"}

# experiment -> (runs it resolves to, new runs after deduplication in this order); docs/paper-config.md
COUNTS = {
    "pfml_table1": (20, 20),
    "pfml_table1_sop": (10, 10),
    "pfml_table1_ibn": (10, 10),
    "pfml_table1_ibn_sop": (5, 5),
    "pfml_table1_dino": (10, 10),
    "pfml_table1_dino_sop": (5, 5),
    "pfml_table1_vit": (10, 10),
    "pfml_table1_vit_sop": (5, 5),
    "pfml_table2_label_noise": (50, 50),
    "pfml_table3_w2": (25, 15),
    "pfml_fig3a_proxies": (80, 70),
    "pfml_fig3a_no_proxies": (10, 10),
    "pfml_fig3b_delta": (60, 50),
    "pfml_fig3c_alpha": (70, 60),
    "pfml_fig3d_delta_rep": (50, 50),
    "pfml_supp_table1_64d": (10, 10),
    "pfml_supp_table2_64d": (5, 5),
    "pfml_supp_table5_hparams": (2, 0),
    "pfml_supp_table5_hparams_sop": (1, 0),
    "pfml_supp_table5_hparams_ibn": (2, 0),
    "pfml_supp_table5_hparams_ibn_sop": (1, 0),
    "pfml_supp_table6_timing": (5, 5),
    "pfml_supp_fig1_retrieval": (2, 0),
    "pfml_supp_fig1_retrieval_sop": (1, 0),
    "pfml_supp_fig2_tsne": (1, 0),
    "pfml_fig2_toy_field": (0, 0),
}
TOTAL = 400
TABLE1 = [name for name in COUNTS if name.startswith("pfml_table1")]


@pytest.fixture(scope="module")
def config():
    with open(CONFIG, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def runs(config):
    return resolve_runs(config)


def test_validates_against_the_workflow_schema(config):
    validate(copy.deepcopy(config), str(SCHEMA))


def test_run_counts_per_experiment_and_after_deduplication(config, runs):
    assert list(config["experiments"]) == list(COUNTS)
    seen, found = set(), {}
    for name in config["experiments"]:
        ids = [run.run_id for run in experiment_runs(runs, name)]
        assert len(ids) == len(set(ids))
        found[name] = (len(ids), len(set(ids) - seen))
        seen.update(ids)
    assert found == COUNTS
    assert len(runs) == TOTAL


def test_only_the_real_benchmarks_at_224_px(runs):
    for run in runs.values():
        dataset = run.config["dataset"]
        assert run.dataset in REAL and dataset["name"] == run.dataset, run.run_id
        assert dataset["image_size"] == 224 and dataset["resize"] == 256, run.run_id
        assert run.config["model"]["pretrained"], run.run_id


def test_report_blocks_name_the_printed_datasets(config):
    """Real datasets mapped to their printed names, so the report computes Δ (not a stand-in)."""
    for name, experiment in config["experiments"].items():
        mapping = (experiment.get("report") or {}).get("datasets") or {}
        for dataset in experiment["datasets"]:
            assert mapping.get(dataset) == PRINTED[dataset], (name, dataset)


def test_table1_runs_200_epochs_5_seeds_with_the_papers_m_and_width(runs):
    width = {"resnet50": 512, "bn_inception": 512, "dino_vits16": 384, "vit_small_patch16_224": 384}
    for name in TABLE1:
        table = experiment_runs(runs, name)
        assert sorted({run.seed for run in table}) == [0, 1, 2, 3, 4], name
        for run in table:
            assert run.config["epochs"] == 200, run.run_id
            assert run.config["loss"]["hparams"]["proxies_per_class"] == (2 if run.dataset == "sop" else 15)
            assert run.config["model"]["embedding_size"] == width[run.config["model"]["backbone"]], run.run_id


def test_epochs_everywhere_but_the_timing_runs(runs):
    for run in runs.values():
        timing = set(run.experiments) == {"pfml_supp_table6_timing"}
        assert run.config["epochs"] == (20 if timing else 200), run.run_id


def test_supp_table5_values_from_the_papers_transcription(runs):
    """Every R50 / BN-Inception Table 1 run carries its supp. Table 5 column."""
    with open(ROOT / "config" / "reported" / "pfml_supp_table5.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    paper = {(r["backbone"], r["dataset"], r["metric"]): r["value"] for r in rows}
    backbones = {"resnet50": "ResNet-50", "bn_inception": "BN-Inception"}
    checked = 0
    for name in TABLE1:
        for run in experiment_runs(runs, name):
            cfg = run.config
            if cfg["model"]["backbone"] not in backbones:
                continue
            column = (backbones[cfg["model"]["backbone"]], PRINTED[run.dataset])
            assert cfg["optimizer"]["name"] == paper[(*column, "optimizer")].lower()
            assert cfg["optimizer"]["lr"] == pytest.approx(float(paper[(*column, "learning_rate")]))
            assert cfg["optimizer"]["weight_decay"] == pytest.approx(float(paper[(*column, "weight_decay")]))
            assert cfg["dataset"]["batch_size"] == int(paper[(*column, "batch_size")])
            frozen = paper[(*column, "bn_freeze")] == "Yes"
            assert cfg["bn_freeze"]["running_stats"] is frozen and cfg["bn_freeze"]["affine"] is frozen
            assert cfg["warmup_epochs"] == int(paper[(*column, "warm_up")])
            proxy_lr = cfg["optimizer"]["lr"] * cfg["optimizer"]["lr_mult"]["loss"]
            assert proxy_lr == pytest.approx(float(paper[(*column, "lr_for_proxies")]))
            checked += 1
    assert checked == 30 + 15  # R50: PFML + CPML x 3 datasets x 5 seeds; IBN: PFML x 3 x 5


def test_table3_and_fig3_reuse_the_table1_runs(runs):
    table1 = {run.run_id for run in experiment_runs(runs, "pfml_table1") if run.dataset == "cub200"}
    table3 = {run.run_id for run in experiment_runs(runs, "pfml_table3_w2") if run.method in ("pfml", "cpml")}
    assert table3 == table1
    default = {run.run_id for run in experiment_runs(runs, "pfml_table1") if run.method == "pfml"}
    for name, point in (("pfml_fig3a_proxies", 15), ("pfml_fig3b_delta", 0.2), ("pfml_fig3c_alpha", 4.0)):
        key = next(iter(experiment_runs(runs, name)[0].experiments[name]))
        shared = {run.run_id for run in experiment_runs(runs, name) if run.experiments[name][key] == point}
        assert shared == default, name


def test_label_noise_and_timing_settings(runs):
    noisy = experiment_runs(runs, "pfml_table2_label_noise")
    assert {run.method for run in noisy} == {"pfml", "triplet", "multi_similarity", "proxy_nca", "proxy_anchor"}
    assert all(run.config["dataset"]["label_noise"]["rate"] == 0.2 for run in noisy)
    timing = experiment_runs(runs, "pfml_supp_table6_timing")
    assert [run.config["loss"]["hparams"].get("proxies_per_class") for run in timing] == [None, None, 5, 20, 30]
    assert all(run.dataset == "cars196" and run.config["dataset"]["batch_size"] == 100 for run in timing)


def test_resources_name_configured_datasets(config):
    train = (config.get("resources") or {}).get("train") or {}
    assert set(train) - {"default"} <= set(config["datasets"])
    assert train["default"]["gpu"] == 1
