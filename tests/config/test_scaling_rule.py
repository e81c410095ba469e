"""The faithful miniature (config/miniature.yaml) applies one scaling rule to every method alike
(docs/miniature.md#the-scaling-rule), read against the papers' settings in config/paper.yaml for the dataset
each miniature dataset stands in for: CUB-200-2011 for the CUB/Cars-shaped `double_mnist`, SOP for the
SOP-shaped `triple_mnist`:

- dimensionless settings are the paper's: proxy lr multipliers, Adam β and ε, weight decay, every loss
  hyperparameter that is not a distance (δ and margins on the unit sphere, decay exponents, warp slopes,
  P, b, λ, memory), the ratio of ASAP's outer to its projection patience;
- a learning rate rises only by √(D_paper / D), which keeps a raw proxy's per-step Adam move lr·√D at the
  paper's; not under RSW's Adam ε = 1, whose step is about lr × gradient (no √D);
- distance-valued settings (RSW's unnormalised Euclidean space: α, and the inverse distance s) are scaled
  by the measured ratio of initial distances to proxy (dmlrepro.miniature_scale), to the power of their
  dimension;
- SOP's counts sized by its data (ASAP's E = 250 steps per evaluation, XBM's memory of 44,800 images) keep
  their share of an epoch of the fold's training images (they would exceed the SOP-shaped data as printed);
- every method trains to its own plateau on class-disjoint validation, under one cap per comparison.
The only settings not the paper's are sizes tied to the miniature's embedding (HIST's HGNN width = D)."""

import copy
import math
from pathlib import Path

import pytest
import yaml

from dmlrepro.miniature_scale import HeadShape, distance_scale
from dmlrepro.runs import resolve_runs

ROOT = Path(__file__).resolve().parents[2]
CUB_SHAPED, SOP_SHAPED = "double_mnist", "triple_mnist"

#: miniature method -> the paper's experiment that trains it on CUB-200-2011
PAPER_EXPERIMENT = {
    **{m: "pfml_table1" for m in ("pfml", "cpml", "proxy_anchor", "proxy_nca", "multi_similarity", "triplet")},
    "hist": "pfml_table2_label_noise",
    "rsw": "rsw_table4_corruptions",
    "rsw_eq4": "rsw_table4_corruptions",
    **{m: "asap_table1" for m in ("c2", "c2_xbm", "c2_asap")},
}
#: SOP-shaped miniature method -> the paper's experiment that trains it on SOP (PFML's with M = 2)
PAPER_SOP_EXPERIMENT = {
    "pfml": "pfml_table1_sop",
    "proxy_anchor": "pfml_table1",
    **{m: "asap_table1" for m in ("c2", "c2_xbm", "c2_asap")},
}
#: loss -> its hyperparameters that are distances, with the power of the distance scale they carry (RSW:
#: α a distance, s multiplies distances)
DISTANCE_KEYS = {"rsw": {"alpha": 1, "scale": -1}}
#: sizes tied to the embedding size D (HIST's HGNN is D wide in the code)
EMBEDDING_SIZED_KEYS = {"hist": {"hgnn_hidden"}}
#: loss -> its hyperparameters counted in training images (XBM's memory)
DATA_SIZED_KEYS = {"xbm_c2": {"memory_size"}}
#: training images of the training split (training and validation classes: CUB's 100, SOP's 11,318 classes;
#: the manifests' 80 and 800): an MLRC fold trains on 3/4 of each
TRAIN_IMAGES = {"cub200": 5864, "sop": 59551, CUB_SHAPED: 80 * 60, SOP_SHAPED: 800 * 6}
#: the comparisons whose methods must share one cap (a claim's cells)
COMPARISONS = [
    {"pfml", "cpml", "proxy_anchor", "proxy_nca", "multi_similarity", "triplet", "hist"},
    {"rsw", "rsw_eq4"},
    {"c2", "c2_xbm", "c2_asap"},
]
#: the validation of PFML's and RSW's comparisons: the protocol's validation classes (the last fifth of the
#: manifest's training labels, docs/data.md), 10 epochs of patience, an improvement of more than 0.001 MAP@R
PROTOCOL_VALIDATION = {
    "split": "fold",
    "scheme": "linspace",
    "n_folds": 5,
    "fold": 4,
    "patience": 10,
    "min_delta": 1e-3,
}


def _yaml(name):
    return yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())


#: miniature method -> the miniature's experiment that compares it in a headline claim
MINIATURE_EXPERIMENT = {
    **PAPER_EXPERIMENT,
    "hist": "pfml_table2_label_noise",
    "rsw": "rsw_table1",
    "rsw_eq4": "rsw_table1",
}
MINIATURE_SOP_EXPERIMENT = {**PAPER_SOP_EXPERIMENT, "pfml": "pfml_table1_sop", "proxy_anchor": "pfml_table1_sop"}


def _miniature(experiments, dataset):
    miniature = _yaml("miniature")
    return {
        m: next(
            r.config
            for r in resolve_runs(miniature, [e]).values()
            if r.method == m and r.seed == 0 and r.dataset == dataset
        )
        for m, e in experiments.items()
    }


def _paper(experiments, dataset):
    paper = _yaml("paper")
    out = {}
    for experiment in sorted(set(experiments.values())):
        methods = [m for m, e in experiments.items() if e == experiment]
        trimmed = copy.deepcopy(paper)
        spec = trimmed["experiments"][experiment]
        spec.update(methods=methods, datasets=[dataset], seeds=[0])
        spec["method_overrides"] = {m: o for m, o in (spec.get("method_overrides") or {}).items() if m in methods}
        if "sweep" in spec:
            spec["sweep"] = {key: values[:1] for key, values in spec["sweep"].items()}
        out.update({r.method: r.config for r in resolve_runs(trimmed, [experiment]).values()})
    return out


@pytest.fixture(scope="module")
def miniature_runs():
    return _miniature(MINIATURE_EXPERIMENT, CUB_SHAPED)


@pytest.fixture(scope="module")
def paper_runs():
    return _paper(PAPER_EXPERIMENT, "cub200")


@pytest.fixture(scope="module")
def miniature_sop_runs():
    return _miniature(MINIATURE_SOP_EXPERIMENT, SOP_SHAPED)


@pytest.fixture(scope="module")
def paper_sop_runs():
    return _paper(PAPER_SOP_EXPERIMENT, "sop")


@pytest.fixture(scope="module")
def scale(miniature_runs):
    cfg = miniature_runs["rsw"]
    trunk_width = cfg["model"]["backbone_kwargs"]["widths"][-1]
    return distance_scale(HeadShape(trunk_width, cfg["model"]["embedding_size"], 64))  # 64 training classes


def expected_lr(paper_lr, mini, paper):
    if mini["optimizer"]["eps"] == 1.0:
        return paper_lr
    return paper_lr * math.sqrt(paper["model"]["embedding_size"] / mini["model"]["embedding_size"])


def data_ratio(mini, paper):
    """An epoch of the miniature's MLRC fold over the paper's, in training images (SOP's data-sized counts)."""
    return TRAIN_IMAGES[mini["dataset"]["name"]] / TRAIN_IMAGES[paper["dataset"]["name"]]


def rule_violations(mini, paper, method, scale, sized_by_data=False):
    """(setting, miniature value, the rule's value) for every setting of `mini` off the rule; with
    `sized_by_data` the paper's counts of its data's size keep their share of an epoch (SOP's)."""
    out = []
    ratio = data_ratio(mini, paper) if sized_by_data else 1.0

    def check(name, value, want, rel=0.01):
        ok = (
            value == want
            if not isinstance(want, float) or not isinstance(value, (int, float))
            else math.isclose(value, want, rel_tol=rel) or (math.isinf(want) and value == want)
        )
        if not ok:
            out.append((name, value, want))

    opt, popt = mini["optimizer"], paper["optimizer"]
    check("optimizer.lr", opt["lr"], expected_lr(popt["lr"], mini, paper))
    for key in ("name", "eps", "betas", "weight_decay"):
        check(f"optimizer.{key}", opt[key], popt[key])
    check("optimizer.lr_mult.loss", opt["lr_mult"]["loss"], popt["lr_mult"]["loss"])
    check("bn_freeze", mini["bn_freeze"], paper["bn_freeze"])
    check("warmup_epochs", mini["warmup_epochs"], paper["warmup_epochs"])
    check("grad_clip", mini["grad_clip"], paper["grad_clip"])  # PFML-R4: clipping is not scaled
    check("schedule.name", mini["schedule"]["name"], paper["schedule"]["name"])
    check("loss.name", mini["loss"]["name"], paper["loss"]["name"])
    distance, sized = DISTANCE_KEYS.get(mini["loss"]["name"], {}), EMBEDDING_SIZED_KEYS.get(method, set())
    for key, want in paper["loss"]["hparams"].items():
        value = mini["loss"]["hparams"].get(key)
        if key in distance:
            want = want * scale ** distance[key]
        elif key in sized:
            want = mini["model"]["embedding_size"]
        elif key in DATA_SIZED_KEYS.get(mini["loss"]["name"], set()):
            want = float(want * ratio)
        check(f"loss.hparams.{key}", value, want)
    follow, pfollow = mini["followup"], paper["followup"]
    if pfollow["epochs"]:
        check("followup.lr", follow["lr"], expected_lr(pfollow["lr"], mini, paper))
        check("followup.lr_mult", follow["lr_mult"], pfollow["lr_mult"])
        if follow["trigger"] == "epochs":  # with `plateau` each phase runs to its own plateau (RSW App. D)
            share = pfollow["epochs"] / paper["epochs"]
            check("followup.epochs share", follow["epochs"] / mini["epochs"], share, rel=0.15)
        for key, want in pfollow["loss"].items():
            check(f"followup.loss.{key}", follow["loss"].get(key), want * scale ** distance.get(key, 0))
    if paper.get("asap", {}).get("enabled"):
        for key in ("b", "lam", "projection_patience"):
            check(f"asap.{key}", mini["asap"][key], paper["asap"][key])
    if "validation" in paper and paper["validation"].get("split") == "fold":
        check("validation.patience", mini["validation"]["patience"], paper["validation"]["patience"])
        check("steps_per_epoch", mini["steps_per_epoch"], float(paper["steps_per_epoch"] * ratio))
    if paper["schedule"]["name"] == "step":
        check(
            "schedule.step share",
            mini["schedule"]["step"] / mini["epochs"],
            paper["schedule"]["step"] / paper["epochs"],
        )
    return out


def test_every_miniature_method_follows_the_rule(miniature_runs, paper_runs, scale):
    assert set(miniature_runs) == set(PAPER_EXPERIMENT)
    violations = {m: rule_violations(miniature_runs[m], paper_runs[m], m, scale) for m in PAPER_EXPERIMENT}
    assert {m: v for m, v in violations.items() if v} == {}


def test_every_sop_shaped_method_follows_the_rule_against_sops_settings(miniature_sop_runs, paper_sop_runs, scale):
    """PFML with M = 2 (PFML §4.1), ASAP's SOP margins, P and b; E and XBM's memory at SOP's share of an epoch."""
    assert set(miniature_sop_runs) == set(PAPER_SOP_EXPERIMENT)
    violations = {
        m: rule_violations(miniature_sop_runs[m], paper_sop_runs[m], m, scale, sized_by_data=True)
        for m in PAPER_SOP_EXPERIMENT
    }
    assert {m: v for m, v in violations.items() if v} == {}
    assert miniature_sop_runs["pfml"]["loss"]["hparams"]["proxies_per_class"] == 2


def test_the_measured_scale_is_the_ratio_of_rsws_head_norms(scale):
    """LayerNorm gives the pooled features norm √C; a Kaiming fan-out Linear(C, D) maps them to norm ≈ √(2C)
    (RSW-R10), so the ratio is about √(96 / 2048) = 0.217 (the proxies add ≈ √(2D / classes), small)."""
    assert scale == pytest.approx(math.sqrt(96 / 2048), rel=0.03)


def test_pfmls_and_rsws_comparisons_train_to_their_own_validation_plateau(miniature_runs, miniature_sop_runs):
    """Rule 4 (PROTO-R10): validation on the protocol's validation classes with a patience, the same for every
    method; RSW's two phases each to its own plateau (App. D); the cap below."""
    methods = [(miniature_runs, m) for m in COMPARISONS[0] | COMPARISONS[1]]
    methods += [(miniature_sop_runs, m) for m in ("pfml", "proxy_anchor")]
    for runs, m in methods:
        validation = runs[m]["validation"]
        assert {k: validation[k] for k in PROTOCOL_VALIDATION} == PROTOCOL_VALIDATION, m
    for m in COMPARISONS[1]:
        assert miniature_runs[m]["followup"]["trigger"] == "plateau", m


def test_the_methods_of_a_comparison_share_one_cap(miniature_runs, miniature_sop_runs):
    comparisons = [(miniature_runs, methods) for methods in COMPARISONS]
    comparisons += [(miniature_sop_runs, {"pfml", "proxy_anchor"}), (miniature_sop_runs, COMPARISONS[2])]
    for runs, methods in comparisons:
        lengths = {
            m: (runs[m]["epochs"], runs[m]["steps_per_epoch"], runs[m]["dataset"]["batch_size"]) for m in methods
        }
        assert len(set(lengths.values())) == 1, lengths


def test_the_check_sees_a_method_specific_exception(
    miniature_runs, paper_runs, miniature_sop_runs, paper_sop_runs, scale
):
    """A method with a learning rate of its own, RSW's α copied unscaled, or SOP's XBM memory copied as
    printed (more than the SOP-shaped data holds) is reported."""
    bad = copy.deepcopy(miniature_runs["proxy_anchor"])
    bad["optimizer"]["lr"] *= 2
    assert [v[0] for v in rule_violations(bad, paper_runs["proxy_anchor"], "proxy_anchor", scale)] == ["optimizer.lr"]
    bad = copy.deepcopy(miniature_runs["rsw"])
    bad["loss"]["hparams"]["alpha"] = paper_runs["rsw"]["loss"]["hparams"]["alpha"]
    assert [v[0] for v in rule_violations(bad, paper_runs["rsw"], "rsw", scale)] == ["loss.hparams.alpha"]
    bad = copy.deepcopy(miniature_sop_runs["c2_xbm"])
    bad["loss"]["hparams"]["memory_size"] = paper_sop_runs["c2_xbm"]["loss"]["hparams"]["memory_size"]
    found = rule_violations(bad, paper_sop_runs["c2_xbm"], "c2_xbm", scale, sized_by_data=True)
    assert [v[0] for v in found] == ["loss.hparams.memory_size"]


def test_each_dataset_fine_tunes_the_trunk_pretrained_on_its_own_canvas():
    """The papers' regime (docs/miniature.md#data): every run starts from the digit-pretrained trunk of its own
    dataset (its canvas, MNIST's training digits only), the runs' trunk; images per class as the benchmark it
    stands for (CUB 5,864 / 100 = 59, SOP 59,551 / 11,318 = 5.3)."""
    miniature = _yaml("miniature")
    per_class = {CUB_SHAPED: 5864 / 100, SOP_SHAPED: 59551 / 11318}
    for run in resolve_runs(miniature).values():
        model, dataset = run.config["model"], run.config["dataset"]
        assert model["pretrained"] == "digit_trunk", run.run_id
        assert model["digit_trunk"]["dataset"] == dataset["name"], run.run_id
        assert model["digit_trunk"]["backbone_kwargs"] == model["backbone_kwargs"], run.run_id
        assert dataset["params"]["images_per_class"] == pytest.approx(per_class[dataset["name"]], rel=0.15), run.run_id
        assert dataset["hflip"] == 0.0, run.run_id  # a flip turns "37" into a mirrored "73"
