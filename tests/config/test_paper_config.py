"""config/paper.yaml: the PFML, RSW and ASAP papers' full settings (docs/paper-config.md).

The config must validate against the workflow schema, resolve to the run counts of the tables in
docs/paper-config.md (a config edit that adds, drops or un-shares runs fails here), train only on
the real benchmarks at 224 px (RSW's large-crop row at 256 px, its toy on FashionMNIST, ASAP's proof of
concept on MNIST), and carry PFML
supp. Table 5's values — checked against the paper's own transcription in
config/reported/pfml_supp_table5.csv, not against the config's text — and the RSW code's
per-dataset values (its Image-Retrieval/config.json, docs/readings/rsw.md#rsw-r3, transcribed below); ASAP's
per-dataset values (App. A.2) are checked against dmlrepro.asap.settings.SETTINGS and the paper's tables transcribed
below.
"""

import copy
import csv
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from dmlrepro.runs import experiment_runs, resolve_runs
from dmlrepro.train import resolve_run_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "paper.yaml"
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
REAL = {"cub200", "cars196", "sop", "inshop"}
PRINTED = {
    "cub200": "CUB-200-2011",
    "cars196": "Cars-196",
    "sop": "SOP",
    "inshop": "In-Shop",
    "mnist": "MNIST",
    "fashion_mnist": "FashionMNIST",
}

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
    "pfml_table2_label_noise": (60, 60),
    "pfml_table3_w2": (25, 15),
    "pfml_fig3a_proxies": (80, 70),
    "pfml_fig3a_no_proxies": (10, 10),
    "pfml_fig3b_delta": (60, 50),
    "pfml_fig3c_alpha": (70, 60),
    "pfml_fig3d_delta_rep": (50, 50),
    "pfml_supp_table1_64d": (10, 10),
    "pfml_supp_table2_64d": (5, 5),
    "pfml_supp_table3_mlrc": (20, 20),  # PFML-R25: 4 folds x 5 reproductions per dataset
    "pfml_supp_table4_mlrc": (20, 20),
    "pfml_supp_table5_hparams": (2, 0),
    "pfml_supp_table5_hparams_sop": (1, 0),
    "pfml_supp_table5_hparams_ibn": (2, 0),
    "pfml_supp_table5_hparams_ibn_sop": (1, 0),
    "pfml_supp_table6_timing": (5, 5),
    "pfml_supp_fig1_retrieval": (2, 0),
    "pfml_supp_fig1_retrieval_sop": (1, 0),
    "pfml_supp_fig2_tsne": (1, 0),
    "pfml_fig2_toy_field": (0, 0),
    # RSW (Tables I-IV, Figs. 3, 5-10; Tables V-VIII published only)
    "rsw_table1": (10, 10),  # Warped-Softmax + the ProxyNCA++ rerun (RSW-R18)
    "rsw_table1_cars": (10, 10),
    "rsw_table1_sop": (10, 10),
    "rsw_table1_noval_cub": (15, 15),
    "rsw_table1_noval_cars": (15, 15),
    "rsw_table1_noval_sop": (15, 15),
    "rsw_table2": (5, 0),
    "rsw_table2_cars": (5, 0),
    "rsw_table2_sop": (5, 0),
    "rsw_table3": (11, 11),
    "rsw_table4_corruptions": (4, 2),  # Warped-Softmax and ProxyNCA++ are Table I's seed-0 CUB runs
    "rsw_fig6_alpha": (20, 20),
    "rsw_fig7_k1_k2": (36, 36),
    "rsw_fig8_delta": (10, 9),
    "rsw_fig3_landscape": (0, 0),
    "rsw_fig5_landscape": (0, 0),
    "rsw_fig10_toy": (2, 2),
    "rsw_table5_face": (0, 0),
    "rsw_table6_reality_check_cub": (0, 0),
    "rsw_table7_reality_check_cars": (0, 0),
    "rsw_table8_reality_check_sop": (0, 0),
    # opt-in: the reality check's searches and final stages (test_rsw_reality_check_is_opt_in_search_then_final)
    "rsw_reality_cub": (0, 0),
    "rsw_reality_cars": (0, 0),
    "rsw_reality_sop": (0, 0),
    # ASAP (Table 1: 13 methods x 4 datasets x 4 folds = 208; Tables 2-3 are Table 1's runs)
    "asap_table1": (208, 208),
    "asap_table2": (104, 0),
    "asap_table3": (104, 0),
    # ASAP figures: Fig. 5 56 new, Fig. 3 40, Fig. 4a 24 (C2-ASAP is Fig. 3's P = 8, b = 12 point),
    # Fig. 4b 0, Fig. 7 1, Fig. 8 48 new (batch 32 is Table 1's), cost profile 0
    "asap_fig5_s_vs_l": (144, 56),
    "asap_fig3_proxies_pool": (40, 40),
    "asap_fig4a_alternation": (24, 22),
    "asap_fig4b_steps": (4, 0),
    "asap_fig7_geometry": (1, 1),
    "asap_fig8_batch": (64, 48),
    "asap_fig1_mnist_poc": (1, 1),  # Figs. 1/6: proxy-based C2-ASAP on MNIST
    "asap_mnist_samples": (2, 1),  # Sec. 5.2: + the sample-based run
    "asap_cost_profile": (32, 0),
    "asap_fig2_bayes": (0, 0),  # opt-in: a Bayesian search (test_asap_fig2_is_an_opt_in_search)
}
PFML_TOTAL, RSW_TOTAL, ASAP_TOTAL = 450, 139, 377
# RSW's baseline reruns: Table IV's HIST column (HIST's 10 PFML Table 2 runs are in PFML_TOTAL) and the 15
# ProxyNCA++ runs of Table I (RSW-R18), whose CUB seed-0 run is Table IV's ProxyNCA++ column
RSW_BASELINES = 1 + 15
TOTAL = PFML_TOTAL + RSW_TOTAL + RSW_BASELINES + ASAP_TOTAL
TABLE1 = [name for name in COUNTS if name.startswith("pfml_table1")]
RSW_NMI = {"average": "geometric", "kmeans": "sklearn"}  # NMI as the RSW code computes it (RSW-R8)
TOY = "rsw_fig10_toy"  # FashionMNIST, tiny CNN, 2-d (RSW-R19)
MNIST_POC = {"asap_fig1_mnist_poc", "asap_mnist_samples"}  # ASAP Figs. 1/6, Sec. 5.2
LARGE_CROP = "rsw_large"  # RSW Table I's † row: RandomResizedCrop 256 / Resize 288

# RSW-R3: the official code's Image-Retrieval/config.json, per dataset:
# batch, samples per class, epochs E, followup epochs E_f, (lr, proxy lr, s, α, k1, k2) of phase 1 and
# of phase 2, the Δ multiplier ("margin")
RSW_CONFIG_JSON = {
    "cub200": dict(
        batch=64,
        per_class=8,
        epochs=50,
        followup=30,
        delta=1.30,
        phase1=(0.01, 1.0, 4.525, 28.40, 0.93, 1.15),
        phase2=(0.001, 0.0005, 1.0, 24.68, 0.95, 1.20),
    ),
    "cars196": dict(
        batch=64,
        per_class=16,
        epochs=100,
        followup=50,
        delta=1.50,
        phase1=(0.01, 1.0, 5.0, 30.15, 0.80, 1.15),
        phase2=(0.001, 0.0005, 1.0, 23.25, 0.50, 1.55),
    ),
    "sop": dict(
        batch=192,
        per_class=3,
        epochs=80,
        followup=20,
        delta=1.348,
        phase1=(0.024, 225.0, 3.7442, 13.024979, 0.8563, 1.1181),
        phase2=(0.0075, 0.001, 1.0, 5.841837525406713, 0.8024, 1.6175),
    ),
}


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
    assert sum(1 for run in runs.values() if run.method.startswith("rsw")) == RSW_TOTAL
    assert sum(1 for run in runs.values() if _is_asap(run)) == ASAP_TOTAL


def _is_asap(run):
    return any(name.startswith("asap_") for name in run.experiments)


def test_only_the_real_benchmarks_at_224_px(runs):
    """At 224 px (RSW's large crop 256/288); ASAP's 227/256 (App. A.2) in test_asap_engine_settings."""
    for run in runs.values():
        if set(run.experiments) <= MNIST_POC:  # test_asap_mnist_proof_of_concept
            assert run.dataset == "mnist" and run.config["dataset"]["name"] == "mnist", run.run_id
            continue
        if (
            _is_asap(run) or run.method == "pfml_mlrc"
        ):  # MLRC's 227 px: test_asap_engine_settings, test_pfml_mlrc_engine
            assert run.dataset in REAL and run.config["dataset"]["name"] == run.dataset, run.run_id
            continue
        dataset = run.config["dataset"]
        if set(run.experiments) == {TOY}:
            assert run.dataset == "fashion_mnist" and run.config["model"]["embedding_size"] == 2, run.run_id
            assert dataset["test_split"] == "train", (
                run.run_id
            )  # "the train example overfits": the train split is plotted
            continue
        assert run.dataset in REAL and dataset["name"] == run.dataset, run.run_id
        size = (256, 288) if run.method == LARGE_CROP else (224, 256)
        assert (dataset["image_size"], dataset["resize"]) == size, run.run_id
        assert run.config["model"]["pretrained"], run.run_id


def test_report_blocks_name_the_printed_datasets(config):
    """Real datasets mapped to their printed names, so the report computes Δ (not a stand-in)."""
    for name, experiment in config["experiments"].items():
        mapping = (experiment.get("report") or {}).get("datasets") or {}
        for dataset in experiment["datasets"]:
            assert mapping.get(dataset) == PRINTED[dataset], (name, dataset)


def test_the_summary_headlines_the_papers_own_method(config):
    """ASAP's tables list the baselines C1, C1-XBM-L first (ASAP Table 1): the report's summary row is C2-ASAP-L's."""
    experiments = config["experiments"]
    for name in ["asap_table1", "asap_table2", "asap_table3", "asap_fig8_batch"]:
        assert experiments[name]["report"]["headline"] == "c2_asap", name
    assert experiments["pfml_table3_w2"]["report"]["headline"] == "pfml"


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
        if run.method.startswith("rsw") or _is_asap(run) or run.method in ("pfml_mlrc", *TABLE4_OWN_RECIPES):
            # checked by test_rsw_per_dataset_values_of_the_released_config, test_asap_engine_settings,
            # test_pfml_mlrc_engine, test_table4_baselines_train_their_own_recipes_and_see_the_same_corruptions
            continue
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
    assert {run.method for run in noisy} == {"pfml", "triplet", "multi_similarity", "proxy_nca", "proxy_anchor", "hist"}
    assert all(run.config["dataset"]["label_noise"]["rate"] == 0.2 for run in noisy)
    timing = experiment_runs(runs, "pfml_supp_table6_timing")
    assert [run.config["loss"]["hparams"].get("proxies_per_class") for run in timing] == [None, None, 5, 20, 30]
    assert all(run.dataset == "cars196" and run.config["dataset"]["batch_size"] == 100 for run in timing)


TABLE4_OWN_RECIPES = ("hist", "proxy_nca_pp_rsw")


def test_table1_proxy_nca_pp_rerun_follows_the_official_configs(runs):
    """RSW-R18: ProxyNCA++ with max+avg pooling beside Warped-Softmax in the with-validation block; its
    official cub.json (CUB, and Cars: cars.json was never released) and sop.json (github.com/euwern/proxynca_pp)."""
    official = {
        "cub200": (32, 4, 4e-3, 400.0, 40, RSW_NMI),
        "cars196": (32, 4, 4e-3, 400.0, 40, RSW_NMI),
        "sop": (192, 3, 0.024, 240.0, 80, False),
    }  # batch, per class, lr, proxy lr, epochs, NMI
    found = {}
    for name in ("rsw_table1", "rsw_table1_cars", "rsw_table1_sop"):
        pnca = [run for run in experiment_runs(runs, name) if run.method == "proxy_nca_pp_rsw"]
        assert sorted(run.seed for run in pnca) == [0, 1, 2, 3, 4], name
        for run in pnca:
            c = run.config
            assert c["loss"] == {"name": "proxy_nca", "hparams": {"softmax_scale": 9.0}}
            assert (c["model"]["preset"], c["model"]["embedding_size"], c["optimizer"]["eps"]) == ("rsw", 512, 1.0)
            assert "followup" not in c or not c["followup"]["epochs"], run.run_id  # one phase, no RSW values
            o = c["optimizer"]
            found[run.dataset] = (
                c["dataset"]["batch_size"],
                c["dataset"]["m"],
                o["lr"],
                pytest.approx(o["lr"] * o["lr_mult"]["loss"]),
                c["epochs"],
                c["eval"]["nmi"],
            )
    assert found == official
    pnca_cub0 = {
        run.run_id for run in experiment_runs(runs, "rsw_table1") if run.method == "proxy_nca_pp_rsw" and run.seed == 0
    }
    table4 = {run.run_id for run in experiment_runs(runs, "rsw_table4_corruptions") if run.method == "proxy_nca_pp_rsw"}
    assert pnca_cub0 == table4


def test_table4_baselines_train_their_own_recipes_and_see_the_same_corruptions(runs):
    table4 = {run.method: run for run in experiment_runs(runs, "rsw_table4_corruptions")}
    assert set(table4) == {"rsw", "rsw_eq4", *TABLE4_OWN_RECIPES}
    for method in TABLE4_OWN_RECIPES:
        assert table4[method].config["eval"]["corruptions"] == table4["rsw"].config["eval"]["corruptions"]
        assert "followup" not in table4[method].config or not table4[method].config["followup"]["epochs"]
    pnca = table4["proxy_nca_pp_rsw"].config  # ProxyNCA++'s CUB config on RSW's head (RSW-R18)
    assert pnca["loss"] == {"name": "proxy_nca", "hparams": {"softmax_scale": 9.0}}
    assert (pnca["model"]["preset"], pnca["model"]["pool"] or "avg+max", pnca["model"]["embedding_size"]) == (
        "rsw",
        "avg+max",
        512,
    )
    o = pnca["optimizer"]
    assert (o["name"], o["eps"], o["lr"], o["lr"] * o["lr_mult"]["loss"]) == ("adam", 1.0, 4e-3, pytest.approx(400.0))
    assert (pnca["dataset"]["batch_size"], pnca["dataset"]["m"], pnca["epochs"]) == (32, 4, 40)


# HIST's official README (github.com/ljin0429/HIST): per dataset τ, α, epochs, lr, lr_ds, lr-hgnn-factor,
# weight decay, StepLR step, BN frozen; batch 32, Adam, 1 warm-up epoch, γ 0.5, λ_s 1, HGNN hidden 512
HIST_README = {
    "cub200": (32, 1.1, 40, 1.2e-4, 0.1, 5, 5e-5, 5, True),
    "cars196": (32, 0.9, 50, 1e-4, 0.1, 10, 1e-4, 10, True),
    "sop": (16, 2.0, 60, 1e-4, 1e-2, 10, 1e-4, 10, False),
}


def test_hist_runs_follow_the_official_readme(runs):
    hist = [run for run in runs.values() if run.method == "hist"]
    assert {run.dataset for run in hist} == {"cub200", "cars196"} and len(hist) == 11
    for run in hist:
        cfg, hp = run.config, run.config["loss"]["hparams"]
        tau, alpha, epochs, lr, lr_ds, factor, wd, step, bn = HIST_README[run.dataset]
        assert (hp["tau"], hp["alpha"], hp["lambda_s"], hp["hgnn_hidden"], hp["hgnn_lr_factor"]) == (
            tau,
            alpha,
            1.0,
            512,
            factor,
        )
        o = cfg["optimizer"]
        assert (o["name"], cfg["epochs"], cfg["warmup_epochs"]) == ("adam", epochs, 1)
        assert o["lr"] == pytest.approx(lr) and o["lr"] * o["lr_mult"]["loss"] == pytest.approx(lr_ds)
        assert o["weight_decay"] == pytest.approx(wd) and o["lr_mult"]["backbone"] == 1.0
        assert cfg["schedule"] == {**cfg["schedule"], "name": "step", "step": step, "gamma": 0.5}
        assert cfg["bn_freeze"]["running_stats"] is bn and cfg["bn_freeze"]["affine"] is bn
        assert (cfg["dataset"]["batch_size"], cfg["dataset"]["sampler"]) == (32, "random")
        assert (
            cfg["model"]["preset"] == "hist"
            and not cfg["model"]["l2_normalize"]
            and cfg["eval"]["distance"] == "cosine"
        )
    (table4,) = [run for run in hist if "rsw_table4_corruptions" in run.experiments]
    assert table4.dataset == "cub200" and len(table4.config["eval"]["corruptions"]) == 9


def test_resources_name_configured_datasets(config):
    train = (config.get("resources") or {}).get("train") or {}
    assert set(train) - {"default"} <= set(config["datasets"])
    assert train["default"]["gpu"] == 1


# ---- RSW ---------------------------------------------------------------------------------------------

RSW_TRAINED = [name for name in COUNTS if name.startswith("rsw_") and COUNTS[name][0]]
RSW_TABLE1 = [
    "rsw_table1",
    *(f"rsw_table1_{suffix}" for suffix in ("cars", "sop", "noval_cub", "noval_cars", "noval_sop")),
]


def test_rsw_engine_settings(runs):
    """The RSW code's model and optimiser (RSW-R10) on every trained RSW run."""
    for name in RSW_TRAINED:
        for run in experiment_runs(runs, name):
            cfg = run.config
            if run.method in TABLE4_OWN_RECIPES:  # Table IV's HIST and ProxyNCA++ columns (test_table4_baselines)
                continue
            assert cfg["loss"]["name"] == "rsw", run.run_id
            assert cfg["model"]["preset"] == "rsw" and cfg["model"]["l2_normalize"] is False, run.run_id
            assert cfg["optimizer"]["name"] == "adam" and cfg["optimizer"]["eps"] == 1.0, run.run_id
            assert cfg["optimizer"]["weight_decay"] == pytest.approx(1e-7), run.run_id
            assert cfg["grad_clip"] == {"value": 10.0, "groups": ["backbone", "head"]}, run.run_id
            assert cfg["eval"]["distance"] == "euclidean", run.run_id
            assert cfg["warmup_epochs"] == 0 and not cfg["bn_freeze"]["running_stats"], run.run_id
            assert cfg["schedule"]["name"] == "none", run.run_id
            if name == TOY:
                continue
            assert cfg["model"]["backbone"] == "resnet50" and cfg["model"]["pretrained"] == "resnet50.tv_in1k"
            assert cfg["model"]["embedding_size"] == 512, run.run_id
            assert cfg["model"]["head_init"] == ("default" if run.dataset == "sop" else None), run.run_id
            assert cfg["dataset"]["sampler"] == "m_per_class", run.run_id


def test_rsw_per_dataset_values_of_the_released_config(runs):
    """Table I/II, Table IV, Figs. 6-8: the code's config.json (RSW-R3) per dataset, two phases."""
    checked = 0
    for name in [*RSW_TABLE1, "rsw_table4_corruptions", "rsw_fig6_alpha", "rsw_fig7_k1_k2", "rsw_fig8_delta"]:
        for run in experiment_runs(runs, name):
            if run.method in TABLE4_OWN_RECIPES:  # Table IV's HIST and ProxyNCA++ columns (test_table4_baselines)
                continue
            cfg, want = run.config, RSW_CONFIG_JSON[run.dataset]
            point = run.experiments[name]
            hp, follow = cfg["loss"]["hparams"], cfg["followup"]
            assert cfg["dataset"]["batch_size"] == want["batch"], run.run_id
            assert cfg["dataset"]["m"] == want["per_class"], run.run_id
            assert (cfg["epochs"], follow["epochs"]) == (want["epochs"], want["followup"]), run.run_id
            lr, proxy_lr, scale, alpha, k1, k2 = want["phase1"]
            assert cfg["optimizer"]["lr"] == pytest.approx(lr), run.run_id
            assert cfg["optimizer"]["lr"] * cfg["optimizer"]["lr_mult"]["loss"] == pytest.approx(proxy_lr), run.run_id
            expected = {"scale": scale, "alpha": alpha, "k1": k1, "k2": k2, "delta_scale": want["delta"]}
            expected.update({key.rsplit(".", 1)[1]: value for key, value in point.items()})  # the swept value
            assert {key: hp[key] for key in expected} == pytest.approx(expected), run.run_id
            assert hp.get("warp", True) is (run.method not in ("rsw_eq4", "rsw_eq4_noval")), run.run_id
            lr, proxy_lr, scale, alpha, k1, k2 = want["phase2"]
            assert follow["lr"] == pytest.approx(lr), run.run_id
            assert follow["lr"] * follow["lr_mult"]["loss"] == pytest.approx(proxy_lr), run.run_id
            assert follow["loss"] == pytest.approx({"scale": scale, "alpha": alpha, "k1": k1, "k2": k2}), run.run_id
            assert cfg["eval"]["nmi"] == (RSW_NMI if run.dataset != "sop" else False), run.run_id
            checked += 1
    assert checked == 15 + 45 + 2 + 20 + 36 + 10


def test_rsw_table1_protocols(runs):
    """With a validation set: final epoch, 5 seeds; without: best test epoch; † large crop (RSW-R4, RSW-R6)."""
    for name in RSW_TABLE1:
        table = experiment_runs(runs, name)
        assert sorted({run.seed for run in table}) == [0, 1, 2, 3, 4], name
        for run in table:
            noval = "noval" in name
            assert run.config["eval"]["select"] == ("best_test" if noval else "last"), run.run_id
            assert run.config["eval"]["every"] == (5 if noval else 0), run.run_id
    noval = experiment_runs(runs, "rsw_table1_noval_cub")
    assert {run.method for run in noval} == {"rsw_eq4_noval", "rsw_noval", LARGE_CROP}


def test_rsw_runs_shared_between_targets(runs):
    """Table II is Table I's with-val runs; Table IV's Warped-Softmax is the CUB seed-0 one (evaluated under
    the corruptions); Fig. 8's k = 1.5 point is the Cars seed-0 one."""
    for table1, table2 in (
        ("rsw_table1", "rsw_table2"),
        ("rsw_table1_cars", "rsw_table2_cars"),
        ("rsw_table1_sop", "rsw_table2_sop"),
    ):
        ids = {run.run_id for run in experiment_runs(runs, table1) if run.method == "rsw"}
        assert {run.run_id for run in experiment_runs(runs, table2)} == ids
    cub0 = next(run for run in experiment_runs(runs, "rsw_table1") if run.seed == 0 and run.method == "rsw")
    table4 = {run.method: run for run in experiment_runs(runs, "rsw_table4_corruptions")}
    assert table4["rsw"].run_id == cub0.run_id
    assert len(cub0.config["eval"]["corruptions"]) == 9
    assert table4["rsw_eq4"].config["eval"]["corruptions"] == cub0.config["eval"]["corruptions"]
    cars0 = next(run for run in experiment_runs(runs, "rsw_table1_cars") if run.seed == 0)
    shared = [run for run in experiment_runs(runs, "rsw_fig8_delta") if run.run_id == cars0.run_id]
    assert [run.experiments["rsw_fig8_delta"] for run in shared] == [{"loss.hparams.delta_scale": 1.5}]


def test_rsw_sweep_grids(runs):
    """RSW-R16: α in {0, 5, ..., 95}; k1 x k2 6 x 6 with 1.0 in both; k in {1.0, 1.5, ..., 5.5}."""

    def values(name, key):
        return [run.experiments[name][key] for run in experiment_runs(runs, name)]

    assert values("rsw_fig6_alpha", "loss.hparams.alpha") == [5.0 * i for i in range(20)]
    assert values("rsw_fig8_delta", "loss.hparams.delta_scale") == [1.0 + 0.5 * i for i in range(10)]
    grid = {
        (point["loss.hparams.k1"], point["loss.hparams.k2"])
        for point in (run.experiments["rsw_fig7_k1_k2"] for run in experiment_runs(runs, "rsw_fig7_k1_k2"))
    }
    assert grid == {(k1, k2) for k1 in (0.25, 0.5, 0.75, 0.9, 0.95, 1.0) for k2 in (1.0, 1.05, 1.1, 1.25, 1.5, 2.0)}
    for name in ("rsw_fig6_alpha", "rsw_fig7_k1_k2", "rsw_fig8_delta", "rsw_table3", "rsw_table4_corruptions", TOY):
        assert {run.seed for run in experiment_runs(runs, name)} == {0}, name


def test_rsw_table3_single_phase_without_augmentation(runs):
    table = experiment_runs(runs, "rsw_table3")
    assert [run.method for run in table] == [f"rsw_v{i}" for i in range(1, 9)] + ["rsw_w1", "rsw_w2", "rsw_w3"]
    for run in table:
        cfg = run.config
        assert cfg["epochs"] == 50 and cfg["followup"]["epochs"] == 0, run.run_id
        assert cfg["loss"]["hparams"]["scale"] == 4.525 and cfg["optimizer"]["lr"] == pytest.approx(0.01), run.run_id
        assert cfg["dataset"]["hflip"] == 0.0 and cfg["dataset"]["scale"] == [1.0, 1.0], run.run_id
        assert cfg["dataset"]["ratio"] == [1.0, 1.0], run.run_id
        assert cfg["eval"]["proxy_metrics"] == ["avg_dtp"] and cfg["eval"]["proxy_metrics_per_epoch"], run.run_id
        assert cfg["eval"]["every"] == 1 and cfg["eval"]["before_training"], run.run_id


@pytest.mark.slow
def test_snakemake_configfile_stands_alone(runs, tmp_path):
    """`snakemake --configfile config/paper.yaml` plans exactly this file's runs: the Snakefile loads the
    embedded default (config/config.yaml) only when no --configfile is given, so none of its experiments
    or keys are merged in (Snakemake's own behaviour would deep-merge the two). The manual datasets'
    files are placed (empty): without them their runs are left out (docs/workflow.md#targets)."""
    import re
    import subprocess
    import sys

    from dmlrepro.data.benchmarks import BENCHMARKS
    from dmlrepro.data.prepared import ARCHIVE_DIR

    for name in ("cars196", "inshop"):
        (tmp_path / name / ARCHIVE_DIR).mkdir(parents=True)
        for resource in BENCHMARKS[name].resources:
            (tmp_path / name / ARCHIVE_DIR / resource.filename).touch()
    snakemake = Path(sys.executable).parent / "snakemake"
    out = subprocess.run(
        [
            str(snakemake),
            "-s",
            str(ROOT / "Snakefile"),
            "-d",
            str(ROOT),
            "-n",
            "--configfile",
            str(ROOT / "config" / "paper.yaml"),
            "--config",
            f"data_root={tmp_path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert int(re.search(r"^train\s+(\d+)$", out, re.M).group(1)) == len(runs)


# ---- ASAP --------------------------------------------------------------------------------------------

ASAP_SETTINGS_NAME = {"cub200": "cub", "cars196": "cars", "inshop": "inshop", "sop": "sop"}
# method -> (base loss in dmlrepro.asap.settings, variant) for the pair / ASAP methods
ASAP_PAIR = {
    f"{base}{suffix}": (loss, variant)
    for base, loss in (("c1", "c1"), ("c2", "c2"), ("ms", "ms"), ("triplet", "triplet"))
    for suffix, variant in (("_asap", "L"), ("_asap_s", "S"), ("_proxy", "proxy"))
}
ASAP_PAIR.update(
    {"c1": ("c1", "plain"), "c2": ("c2", "plain"), "ms": ("ms", "plain"), "triplet_mlrc": ("triplet", "plain")}
)
ASAP_XBM = {"c1_xbm": ("c1", "L"), "c2_xbm": ("c2", "L"), "c1_xbm_s": ("c1", "S"), "c2_xbm_s": ("c2", "S")}
XBM_BATCHES = {
    "S": {"cub200": 3, "cars196": 3, "inshop": 100, "sop": 400},  # App. A.2, memory in batches of 32
    "L": {"cub200": 25, "cars196": 25, "inshop": 400, "sop": 1400},
}
SOFT_TRIPLE_PARAMS = {
    "cub200": (20.0, 0.1, 0.01),
    "cars196": (17.69, 19.18, 0.3588),  # λ, γ, δ (§2.6)
    "inshop": (20.0, 0.1, 0.01),
    "sop": (100.0, 47.9, 0.3145),
}
SOFT_TRIPLE = {
    "soft_triple_mlrc": {"cub200": 10, "cars196": 10, "inshop": 1, "sop": 1},  # centres: the tables' rows
    "soft_triple_l4": {"inshop": 4, "sop": 4},
}  # Fig. 5's L on In-Shop / SOP
PROXY_BASELINES = {"proxy_anchor_mlrc", "proxy_nca_pp", "soft_triple_mlrc"}


def test_asap_table1_is_13_methods_x_4_datasets_x_4_folds(runs):
    table = experiment_runs(runs, "asap_table1")
    assert len({run.method for run in table}) == 13
    assert {run.dataset for run in table} == {"cub200", "cars196", "inshop", "sop"}
    cells = {(run.method, run.dataset, run.experiments["asap_table1"]["validation.fold"]) for run in table}
    assert len(cells) == 208 and {cell[2] for cell in cells} == {0, 1, 2, 3}
    assert {run.seed for run in table} == {0}
    one = {run.run_id for run in table}
    assert {run.run_id for run in experiment_runs(runs, "asap_table2")} == {
        run.run_id for run in table if run.dataset in ("inshop", "sop")
    }
    assert {run.run_id for run in experiment_runs(runs, "asap_table3")} == {
        run.run_id for run in table if run.dataset in ("cub200", "cars196")
    }
    assert len(one) == 208


def test_asap_engine_settings(runs):
    """MLRC protocol and the ASAP paper's engine (Sec. 4.4, 5.1, App. A.2) on every ASAP run."""
    for run in experiment_runs(runs, "asap_table1"):
        cfg, fold = run.config, run.experiments["asap_table1"]["validation.fold"]
        assert cfg["validation"]["split"] == "fold" and cfg["validation"]["fold"] == fold, run.run_id
        assert (cfg["validation"]["n_folds"], cfg["validation"]["patience"]) == (4, 60), run.run_id
        assert cfg["validation"]["metric"] == "map@r", run.run_id
        assert cfg["eval"]["select"] == "best_val", run.run_id
        model = cfg["model"]
        assert (model["backbone"], model["pretrained"], model["preset"]) == (
            "bn_inception",
            "bn_inception.imagenet",
            "asap",
        )
        assert model["embedding_size"] == 128 and model["l2_normalize"] is False, run.run_id
        data = cfg["dataset"]
        assert (data["image_size"], data["resize"], data["train_crop"], data["scale"]) == (227, 256, "rrc", [0.16, 1.0])
        assert data["batch_size"] == 32, run.run_id
        assert data["sampler"] == "m_per_class" and data["m"] == (1 if run.method in PROXY_BASELINES else 4), run.run_id
        opt = cfg["optimizer"]
        assert (opt["name"], opt["lr"], opt["weight_decay"], opt["betas"]) == (
            "adam",
            1e-5,
            1e-4,
            [0.9, 0.99],
        )  # ASAP-R8
        assert (cfg["eval"]["normalize"], cfg["eval"]["distance"]) == ("lipschitz", "euclidean"), run.run_id  # ASAP-R32
        proxy = run.method in PROXY_BASELINES
        assert opt["lr_mult"]["loss"] == (100.0 if proxy else 1.0), run.run_id
        assert cfg["warmup_epochs"] == (1 if proxy else 0), run.run_id
        assert cfg["bn_freeze"]["running_stats"] and cfg["bn_freeze"]["affine"], run.run_id
        assert cfg["steps_per_epoch"] == (25 if run.dataset in ("cub200", "cars196") else 250), run.run_id
        assert cfg["epochs"] == 400, run.run_id
        if run.dataset == "inshop":
            assert (data["test_split"], data["gallery_split"]) == ("query", "gallery"), run.run_id


def _asap_table_and_figure_runs(runs):
    """Every run of the ASAP tables and figures except the sweeps that change §2.6's values on purpose
    (Fig. 3's P × b grid, Fig. 8's batch sizes), once each."""
    swept = {"asap_fig3_proxies_pool", "asap_fig8_batch", *MNIST_POC}  # MNIST: test_asap_mnist_proof_of_concept
    return [run for run in runs.values() if any(name.startswith("asap_") for name in set(run.experiments) - swept)]


def test_asap_per_dataset_values_match_dmlrepro_asap_settings(runs):
    from dmlrepro.asap.settings import SETTINGS, asap_settings

    checked = 0
    for run in _asap_table_and_figure_runs(runs):
        cfg, name = run.config, ASAP_SETTINGS_NAME[run.dataset]
        assert cfg["steps_per_epoch"] == SETTINGS[name]["eval_every"], run.run_id
        if run.method in ASAP_PAIR:
            want = asap_settings(name, *ASAP_PAIR[run.method])
            assert cfg["loss"]["name"] == want["loss_name"], run.run_id
            assert cfg["loss"]["hparams"] == pytest.approx(want["loss_hparams"]), run.run_id
            if want["loss_name"].startswith("asap_"):
                asap = cfg["asap"]
                assert asap["enabled"] and asap["alternate"] == want["alternate"], run.run_id
                assert (asap["b"], asap["lam"], asap["projection_patience"]) == (
                    want["b"],
                    pytest.approx(want["lam"]),
                    want["projection_patience"],
                ), run.run_id
            else:
                assert not (cfg.get("asap") or {}).get("enabled"), run.run_id
            checked += 1
        elif run.method in ASAP_XBM:
            base, size = ASAP_XBM[run.method]
            hp = dict(cfg["loss"]["hparams"])
            assert cfg["loss"]["name"] == f"xbm_{base}", run.run_id
            assert (hp.pop("memory_size"), hp.pop("start_step")) == (XBM_BATCHES[size][run.dataset] * 32, 1000), (
                run.run_id
            )
            assert hp == pytest.approx(SETTINGS[name][base]), run.run_id
            checked += 1
        elif run.method in SOFT_TRIPLE:
            la, gamma, margin = SOFT_TRIPLE_PARAMS[run.dataset]
            k = SOFT_TRIPLE[run.method][run.dataset]
            # τ (the centre regulariser, App. A.2) only where there is more than one centre per class
            tau = {"tau": {"cub200": 0.2, "cars196": 0.0669, "inshop": 0.2, "sop": 0.2}[run.dataset]} if k > 1 else {}
            assert cfg["loss"]["hparams"] == pytest.approx(
                dict(centers_per_class=k, la=la, gamma=gamma, margin=margin, **tau)
            )
            checked += 1
        elif run.method == "proxy_nca_pp":
            assert cfg["loss"] == {"name": "proxy_nca", "hparams": {"softmax_scale": pytest.approx(1 / 0.1)}}
            checked += 1
        elif run.method == "proxy_anchor_mlrc":
            assert cfg["loss"]["hparams"] == pytest.approx({"margin": 0.1, "alpha": 32.0}), run.run_id
            checked += 1
    assert checked == len(_asap_table_and_figure_runs(runs)) == 208 + 56 + 24 + 1


def test_asap_mnist_proof_of_concept(runs):
    """ASAP-R28: ResNetV2-20 from scratch, 2-d, P = 4, b = 16 (Sec. 4.4, 5.2); MNIST train/test with 10 % of each
    training digit validating; at most 4 alternations (Figs. 1/6 (b)); proxy- vs sample-based (eq. 4.10)."""
    poc = experiment_runs(runs, "asap_fig1_mnist_poc")
    pair = {run.method: run for run in experiment_runs(runs, "asap_mnist_samples")}
    assert [run.run_id for run in poc] == [pair["c2_asap_mnist"].run_id]
    for method, proxies in (("c2_asap_mnist", "trainable"), ("c2_asap_mnist_samples", "samples")):
        cfg = resolve_run_config(pair[method].config)  # every default filled (run.config drops late defaults)
        model, data, v, asap = cfg["model"], cfg["dataset"], cfg["validation"], cfg["asap"]
        assert (model["backbone"], model["pretrained"], model["embedding_size"]) == ("resnetv2_20", False, 2)
        assert (data["name"], data["image_size"], data["train_split"], data["test_split"]) == (
            "mnist",
            28,
            "train",
            "test",
        )
        assert (v["split"], v["fraction"], v["patience"]) == ("samples", 0.1, 60)
        assert cfg["loss"]["name"] == "asap_c2" and cfg["loss"]["hparams"]["proxies_per_class"] == 4
        assert (asap["enabled"], asap["b"], asap["max_alternations"], asap["proxies"]) == (True, 16, 4, proxies)
        assert cfg["eval"]["select"] == "best_val"
        assert (cfg["eval"]["normalize"], cfg["eval"]["distance"]) == ("lipschitz", "euclidean")  # ASAP-R32
        assert cfg["optimizer"]["betas"] == [0.9, 0.99]  # ASAP-R8


def test_asap_report_names_the_printed_rows(config):
    """Every method maps to a row of the reported CSV; SoftTriple's row name per table (reported/README.md)."""
    soft = {"asap_table1": "SoftTriple-S/L", "asap_table2": "SoftTriple-S", "asap_table3": "SoftTriple-L"}
    for name, row in soft.items():
        report = config["experiments"][name]["report"]
        assert report["mlrc"] is True and report["reported"] == name
        with open(ROOT / "config" / "reported" / f"{name}.csv", newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        printed = {r["method"] for r in rows}
        assert set(report["methods"].values()) == printed, name
        assert report["methods"]["soft_triple_mlrc"] == row
        assert set(report["block_metrics"].values()) == {r["block"] for r in rows}, name
        assert set(report["block_metrics"]) == set(config["experiments"][name]["metrics"]), name


def test_asap_figure_protocols(runs):
    """Figs. 3, 4a, 7 on the ablation split (2/3 train, 1/3 validation, A.2); Figs. 5, 8 on the MLRC folds;
    Fig. 3's P x b grid; Fig. 8's batch sizes at 4 images per class; Fig. 7 saves the projections."""
    for name in ("asap_fig3_proxies_pool", "asap_fig4a_alternation", "asap_fig7_geometry"):
        for run in experiment_runs(runs, name):
            v = run.config["validation"]
            assert (v["split"], v["n_folds"], v["fold"], v["patience"]) == ("fold", 3, 0, 60), (name, run.run_id)
            assert run.dataset in ("cub200", "cars196"), (name, run.run_id)
    grid = {
        (r.config["loss"]["hparams"]["proxies_per_class"], r.config["asap"]["b"], r.dataset)
        for r in experiment_runs(runs, "asap_fig3_proxies_pool")
    }
    assert grid == {(p, b, d) for p in (1, 2, 4, 8) for b in (1, 4, 8, 12, 16) for d in ("cub200", "cars196")}
    (fig7,) = experiment_runs(runs, "asap_fig7_geometry")
    assert fig7.method == "c2_asap" and fig7.config["asap"]["save_val_embeddings"] and fig7.dataset == "cub200"
    batches = {
        (r.method, r.dataset, r.config["dataset"]["batch_size"], r.config["validation"]["fold"])
        for r in experiment_runs(runs, "asap_fig8_batch")
    }
    assert batches == {
        (m, d, b, f)
        for m in ("c2", "c2_asap")
        for d in ("cub200", "cars196")
        for b in (16, 32, 64, 128)
        for f in range(4)
    }
    assert all(r.config["dataset"]["m"] == 4 for r in experiment_runs(runs, "asap_fig8_batch"))
    table1 = {r.run_id for r in experiment_runs(runs, "asap_table1")}
    assert {
        r.run_id for r in experiment_runs(runs, "asap_fig8_batch") if r.config["dataset"]["batch_size"] == 32
    } <= table1
    for run in experiment_runs(runs, "asap_fig5_s_vs_l"):
        assert run.config["validation"]["n_folds"] == 4 and run.dataset in ("inshop", "sop"), run.run_id
    # Fig. 4(b) and the cost profile draw on Table 1's runs only
    assert {
        r.run_id for name in ("asap_fig4b_steps", "asap_cost_profile") for r in experiment_runs(runs, name)
    } <= table1


def test_pfml_mlrc_engine(runs):
    """PFML supp. Tables 3-4 (PFML-R25): MLRC's engine (PROTO-R3) with PFML's loss,
    4 MLRC-scheme folds x 5 reproductions per dataset, CUB patience 9 every 200 steps, Cars 14 every 500."""
    cells = set()
    for name, dataset in (("pfml_supp_table3_mlrc", "cars196"), ("pfml_supp_table4_mlrc", "cub200")):
        for run in experiment_runs(runs, name):
            cfg = run.config
            assert run.dataset == dataset and run.method == "pfml_mlrc", run.run_id
            cells.add((dataset, run.seed, cfg["validation"]["fold"]))
            v = cfg["validation"]
            assert (v["split"], v["n_folds"], v["scheme"], v["metric"]) == ("fold", 4, "mlrc", "map@r"), run.run_id
            assert (v["patience"], cfg["steps_per_epoch"]) == ((9, 200) if dataset == "cub200" else (14, 500))
            assert cfg["steps_per_epoch"] * cfg["epochs"] == 1000 * 100, run.run_id  # 1000 MLRC epochs of 100
            model, data, opt = cfg["model"], cfg["dataset"], cfg["optimizer"]
            assert (model["backbone"], model["preset"], model["embedding_size"]) == ("bn_inception", "mlrc", 128)
            assert (data["image_size"], data["resize"], data["scale"], data["batch_size"], data["m"]) == (
                227,
                256,
                [0.16, 1.0],
                32,
                4,
            ), run.run_id
            assert (opt["name"], opt["lr"], opt["weight_decay"], opt["momentum"]) == ("rmsprop", 1e-6, 1e-4, 0.9)
            assert (
                cfg["schedule"]["name"] == "none" and cfg["bn_freeze"]["running_stats"] and cfg["bn_freeze"]["affine"]
            )
            assert cfg["eval"]["select"] == "best_val" and cfg["loss"]["name"] == "pfml", run.run_id
            assert cfg["loss"]["hparams"]["proxies_per_class"] == 15, run.run_id
    assert cells == {(d, s, f) for d in ("cub200", "cars196") for s in range(5) for f in range(4)}


def test_asap_fig2_is_an_opt_in_search(config):
    """ASAP Fig. 2 (ASAP-R27): left out unless chosen (opt_in), then one search of λ ({0} ∪ log-U[1e-6, 1])
    × P (1..12), ~35 trials, over C2-ASAP on CUB's ablation split with b = 12; no runs of its own."""
    from dmlrepro.runs import active_experiments
    from dmlrepro.tuning.searches import search_runs

    assert "asap_fig2_bayes" not in active_experiments(config) and not search_runs(config)
    chosen = {**config, "opt_in": ["asap_fig2_bayes"]}
    assert "asap_fig2_bayes" in active_experiments(chosen)
    (search,) = search_runs(chosen).values()
    spec = config["experiments"]["asap_fig2_bayes"]["search"]
    assert spec["space"]["asap.lam"] == {"type": "float", "low": 1e-6, "high": 1.0, "log": True, "zero": True}
    assert spec["space"]["loss.hparams.proxies_per_class"] == {"type": "int", "low": 1, "high": 12}
    assert 30 <= spec["trials"] <= 40
    cfg = search.config
    assert search.method == "c2_asap" and search.dataset == "cub200" and cfg["asap"]["b"] == 12
    assert (cfg["validation"]["n_folds"], cfg["validation"]["fold"]) == (3, 0)
    assert not resolve_runs(chosen).keys() - resolve_runs(config).keys()  # a search trains no workflow run


def test_rsw_reality_check_is_opt_in_search_then_final(config):
    """RSW App. D (RSW-R21): per dataset the App. D-A losses, one 50-trial search over 4 folds each,
    then 10 reproductions × 4 folds + 10 Complete (512-d, no validation) runs of the best point."""
    from dmlrepro.runs import active_experiments
    from dmlrepro.search_space import parse_space
    from dmlrepro.tuning.final import COMPLETE_KEY, final_runs
    from dmlrepro.tuning.searches import method_search_spec, search_runs

    names = ["rsw_reality_cub", "rsw_reality_cars", "rsw_reality_sop"]
    assert not set(names) & set(active_experiments(config))
    chosen = {**config, "opt_in": names}
    searches = search_runs(chosen)
    losses = {
        "cub200": {"contrastive", "cosface", "arcface", "proxy_anchor", "proxy_nca_pp", "hist", "rsw"},
        "cars196": {"multi_similarity", "cosface", "soft_triple", "proxy_anchor", "proxy_nca_pp", "hist", "rsw"},
        "sop": {"proxy_nca", "normalized_softmax", "arcface", "proxy_anchor", "proxy_nca_pp", "rsw"},
    }
    assert {(s.dataset, s.method.removeprefix("rc_")) for s in searches.values()} == {
        (d, m) for d, ms in losses.items() for m in ms
    }
    backbone = {"cub200": "resnet50", "cars196": "resnet50", "sop": "bn_inception"}
    for search in searches.values():
        (name,) = search.experiments
        spec = method_search_spec(config["experiments"][name]["search"], search.method)
        assert spec["trials"] == 50 and spec["folds"] == [0, 1, 2, 3]
        cfg = search.config
        assert (cfg["model"]["backbone"], cfg["model"]["embedding_size"]) == (backbone[search.dataset], 128)
        assert cfg["model"]["preset"] == "rsw" and cfg["optimizer"]["name"] == "rmsprop"
        assert cfg["validation"]["scheme"] == "mlrc" and cfg["validation"]["metric"] == "map@r"
        assert cfg["followup"]["trigger"] == "plateau"  # two phases, each until validation plateaus [P]
        space = parse_space(spec["space"])
        assert {"optimizer.lr", "followup.lr"} <= {p.key for p in space} and len(space) >= 3  # and the loss's own
        runs = final_runs(
            chosen, name, search, {p.key: p.example() for p in space}, {"epochs": 35, "followup_epochs": 10}
        )
        complete = [r for r in runs.values() if r.experiments[name].get(COMPLETE_KEY)]
        assert len(runs) == 10 * 4 + 10 and len(complete) == 10
        assert all(
            r.config["model"]["embedding_size"] == 512
            and r.config["validation"]["split"] is None
            and (r.config["epochs"], r.config["followup"]["epochs"]) == (35, 10)
            for r in complete
        )
