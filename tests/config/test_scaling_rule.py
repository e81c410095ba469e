"""The faithful miniature (config/miniature.yaml) applies one scaling rule to every method alike
(docs/miniature.md#the-scaling-rule), read against the papers' settings in config/paper.yaml (CUB-200-2011,
the dataset `synthetic` stands in for):

- dimensionless settings are the paper's: proxy lr multipliers, Adam β and ε, weight decay, every loss
  hyperparameter that is not a distance (δ and margins on the unit sphere, decay exponents, warp slopes,
  P, b, λ, memory), the ratio of ASAP's outer to its projection patience;
- a learning rate rises only by √(D_paper / D), which keeps a raw proxy's per-step Adam move lr·√D at the
  paper's; not under RSW's Adam ε = 1, whose step is about lr × gradient (no √D);
- distance-valued settings (RSW's unnormalised Euclidean space: α, and the inverse distance s) are scaled
  by the measured ratio of initial distances to proxy (dmlrepro.miniature_scale), to the power of their
  dimension;
- every method a claim compares trains equally long (the reference baseline's plateau).
The only settings not the paper's are sizes tied to the miniature's embedding (HIST's HGNN width = D)."""

import copy
import math
from pathlib import Path

import pytest
import yaml

from dmlrepro.miniature_scale import HeadShape, distance_scale
from dmlrepro.runs import resolve_runs

ROOT = Path(__file__).resolve().parents[2]

#: miniature method -> the paper's experiment that trains it on CUB-200-2011
PAPER_EXPERIMENT = {
    **{m: "pfml_table1" for m in ("pfml", "cpml", "proxy_anchor", "proxy_nca", "multi_similarity", "triplet")},
    "hist": "pfml_table2_label_noise",
    "rsw": "rsw_table4_corruptions",
    "rsw_eq4": "rsw_table4_corruptions",
    **{m: "asap_table1" for m in ("c2", "c2_xbm", "c2_asap")},
}
#: loss -> its hyperparameters that are distances, with the power of the distance scale they carry (RSW:
#: α a distance, s multiplies distances)
DISTANCE_KEYS = {"rsw": {"alpha": 1, "scale": -1}}
#: sizes tied to the embedding size D (HIST's HGNN is D wide in the code)
EMBEDDING_SIZED_KEYS = {"hist": {"hgnn_hidden"}}
#: the comparisons whose methods must train equally long (a claim's cells)
COMPARISONS = [
    {"pfml", "cpml", "proxy_anchor", "proxy_nca", "multi_similarity", "triplet", "hist"},
    {"rsw", "rsw_eq4"},
    {"c2", "c2_xbm", "c2_asap"},
]


def _yaml(name):
    return yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())


#: miniature method -> the miniature's experiment that compares it in a headline claim
MINIATURE_EXPERIMENT = {
    **PAPER_EXPERIMENT,
    "hist": "pfml_table2_label_noise",
    "rsw": "rsw_table1",
    "rsw_eq4": "rsw_table1",
}


@pytest.fixture(scope="module")
def miniature_runs():
    miniature = _yaml("miniature")
    return {
        m: next(
            r.config
            for r in resolve_runs(miniature, [e]).values()
            if r.method == m and r.seed == 0 and r.config.get("validation", {}).get("fold", 0) == 0
        )
        for m, e in MINIATURE_EXPERIMENT.items()
    }


@pytest.fixture(scope="module")
def paper_runs():
    paper = _yaml("paper")
    out = {}
    for experiment in sorted(set(PAPER_EXPERIMENT.values())):
        methods = [m for m, e in PAPER_EXPERIMENT.items() if e == experiment]
        trimmed = copy.deepcopy(paper)
        spec = trimmed["experiments"][experiment]
        spec.update(methods=methods, datasets=["cub200"], seeds=[0])
        spec["method_overrides"] = {m: o for m, o in (spec.get("method_overrides") or {}).items() if m in methods}
        if "sweep" in spec:
            spec["sweep"] = {key: values[:1] for key, values in spec["sweep"].items()}
        out.update({r.method: r.config for r in resolve_runs(trimmed, [experiment]).values()})
    return out


@pytest.fixture(scope="module")
def scale(miniature_runs):
    cfg = miniature_runs["rsw"]
    trunk_width = cfg["model"]["backbone_kwargs"]["widths"][-1]
    return distance_scale(HeadShape(trunk_width, cfg["model"]["embedding_size"], 64))  # 64 training classes


def expected_lr(paper_lr, mini, paper):
    if mini["optimizer"]["eps"] == 1.0:
        return paper_lr
    return paper_lr * math.sqrt(paper["model"]["embedding_size"] / mini["model"]["embedding_size"])


def rule_violations(mini, paper, method, scale):
    """(setting, miniature value, the rule's value) for every setting of `mini` off the rule."""
    out = []

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
        check(f"loss.hparams.{key}", value, want)
    follow, pfollow = mini["followup"], paper["followup"]
    if pfollow["epochs"]:
        check("followup.lr", follow["lr"], expected_lr(pfollow["lr"], mini, paper))
        check("followup.lr_mult", follow["lr_mult"], pfollow["lr_mult"])
        check("followup.epochs share", follow["epochs"] / mini["epochs"], pfollow["epochs"] / paper["epochs"], rel=0.15)
        for key, want in pfollow["loss"].items():
            check(f"followup.loss.{key}", follow["loss"].get(key), want * scale ** distance.get(key, 0))
    if paper.get("asap", {}).get("enabled"):
        for key in ("b", "lam", "projection_patience"):
            check(f"asap.{key}", mini["asap"][key], paper["asap"][key])
    if "validation" in paper and paper["validation"].get("split") == "fold":
        check("validation.patience", mini["validation"]["patience"], paper["validation"]["patience"])
        check("steps_per_epoch", mini["steps_per_epoch"], paper["steps_per_epoch"])
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


def test_the_measured_scale_is_the_ratio_of_rsws_head_norms(scale):
    """LayerNorm gives the pooled features norm √C; a Kaiming fan-out Linear(C, D) maps them to norm ≈ √(2C)
    (RSW-R10), so the ratio is about √(96 / 2048) = 0.217 (the proxies add ≈ √(2D / classes), small)."""
    assert scale == pytest.approx(math.sqrt(96 / 2048), rel=0.03)


def test_every_method_of_pfmls_comparisons_trains_to_its_own_validation_plateau(miniature_runs):
    """Rule 4 (PROTO-R10): class-disjoint validation with a patience, the same for every method; the cap below."""
    for m in COMPARISONS[0]:
        validation = miniature_runs[m]["validation"]
        assert (validation["split"], validation["patience"]) == ("fold", 10), m


def test_the_methods_of_a_comparison_share_one_cap(miniature_runs):
    for methods in COMPARISONS:
        lengths = {
            m: (
                miniature_runs[m]["epochs"],
                miniature_runs[m]["steps_per_epoch"],
                miniature_runs[m]["dataset"]["batch_size"],
            )
            for m in methods
        }
        assert len(set(lengths.values())) == 1, lengths


def test_the_check_sees_a_method_specific_exception(miniature_runs, paper_runs, scale):
    """A method with a learning rate of its own, or RSW's α copied unscaled, is reported."""
    bad = copy.deepcopy(miniature_runs["proxy_anchor"])
    bad["optimizer"]["lr"] *= 2
    assert [v[0] for v in rule_violations(bad, paper_runs["proxy_anchor"], "proxy_anchor", scale)] == ["optimizer.lr"]
    bad = copy.deepcopy(miniature_runs["rsw"])
    bad["loss"]["hparams"]["alpha"] = paper_runs["rsw"]["loss"]["hparams"]["alpha"]
    assert [v[0] for v in rule_violations(bad, paper_runs["rsw"], "rsw", scale)] == ["loss.hparams.alpha"]


def test_the_miniature_fine_tunes_the_defaults_stand_in():
    default, miniature = _yaml("config"), _yaml("miniature")
    assert miniature["datasets"]["synthetic"] == default["datasets"]["synthetic"]
