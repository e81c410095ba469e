"""The embedded default's opt-in reality-check miniature (config/config.yaml rsw_reality_mini) plans:
per loss one search with its own lr ranges whose runs switch phases on a validation plateau, and a
final stage whose Complete runs resolve (search_runs probes them at plan time)."""

import copy
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from dmlrepro.runs import active_experiments
from dmlrepro.tuning.searches import method_search_spec, search_runs

ROOT = Path(__file__).resolve().parents[2]


def test_reality_miniature_is_opt_in_and_plans_a_plateau_search_per_loss():
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate(copy.deepcopy(config), str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    assert "rsw_reality_mini" not in active_experiments(config)
    searches = [
        s
        for s in search_runs({**config, "opt_in": ["rsw_reality_mini"]}).values()
        if "rsw_reality_mini" in s.experiments
    ]
    assert sorted(s.method for s in searches) == ["hist", "proxy_anchor", "rsw"]
    spec = config["experiments"]["rsw_reality_mini"]["search"]
    for search in searches:
        cfg = search.config
        assert cfg["followup"]["trigger"] == "plateau" and cfg["validation"]["patience"] == 2
        assert set(method_search_spec(spec, search.method)["space"]) == {"optimizer.lr", "followup.lr"}
    rsw = next(s for s in searches if s.method == "rsw")
    assert rsw.config["followup"]["loss"]  # RSW's phase-2 warp values stay


# -- the pretrained regime (docs/miniature.md) ---------------------------------------------------------
HEADLINE_CLAIMS = [
    "pfml-beats-proxy-anchor",
    "pfml-beats-cpml",
    "pfml-beats-multi-similarity",
    "pfml-beats-all-table1",
    "pfml-label-noise",
    "pfml-proxies-help",
    "pfml-no-decay-worst",
    "pfml-strong-decay-better",
    "rsw-warp-beats-eq4",
    "asap-beats-base-loss",
    "asap-beats-xbm",
    "pfml-w2-lowest",
]
PFML_FAMILY = {
    "pfml",
    "cpml",
    "proxy_anchor",
    "proxy_nca",
    "multi_similarity",
    "triplet",
    "soft_triple",
    "pfml_m5",
    "pfml_m10",
}


def _default_runs():
    from dmlrepro.runs import resolve_runs

    return resolve_runs(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))


def test_the_default_trains_on_digit_pairs_from_the_digit_trunk_or_on_digits_from_scratch():
    """No run of the default trains on generated data (docs/miniature.md#the-embedded-default): the tables on
    `double_digits` fine-tune the digit-pretrained trunk without flips (a mirrored "37" is no digit pair), the
    2-d toys train on `digits` from scratch."""
    runs = _default_runs().values()
    assert {run.dataset for run in runs} == {"double_digits", "digits"}
    for run in runs:
        model, dataset = run.config["model"], run.config["dataset"]
        if run.dataset == "double_digits":
            assert model["pretrained"] == "digit_trunk" and dataset["hflip"] == 0.0, run.run_id
            assert model["digit_trunk"]["backbone_kwargs"] == model["backbone_kwargs"], run.run_id
        else:
            assert not model["pretrained"], run.run_id


def test_digit_pair_runs_finetune_the_trunk_with_each_papers_recipe_structure():
    """Every double_digits run starts from the digit trunk; BN freeze, warm-up and the proxies' lr multiplier are
    the paper's: PFML supp. Table 5 (CUB: BN frozen, warm-up 1, proxies at 100 x lr; its baselines alike, Sec.
    4.4), RSW's code (BN trained, no warm-up, proxies 100 x), ASAP App. A.2 (BN frozen, no warm-up, proxies at
    lr)."""
    frozen, trained = {"running_stats": True, "affine": True}, {"running_stats": False, "affine": False}
    for run in _default_runs().values():
        cfg = run.config
        assert (cfg["model"]["pretrained"] == "digit_trunk") == (run.dataset == "double_digits"), run.run_id
        bn = {k: cfg["bn_freeze"][k] for k in ("running_stats", "affine")}
        if run.method in PFML_FAMILY:
            assert (bn, cfg["warmup_epochs"], cfg["optimizer"]["lr_mult"]["loss"]) == (frozen, 1, 100.0), run.run_id
        elif run.method in {"rsw", "rsw_eq4"}:
            assert (bn, cfg["warmup_epochs"], cfg["optimizer"]["lr_mult"]["loss"]) == (trained, 0, 100.0), run.run_id
        elif run.method in {"c2", "c2_xbm", "c2_asap"}:
            assert (bn, cfg["warmup_epochs"], cfg["optimizer"]["lr_mult"]["loss"]) == (frozen, 0, 1.0), run.run_id


def _cell_seeds(runs, cell):
    from dmlrepro.nested import dotted_get

    experiments = cell["experiment"] if isinstance(cell["experiment"], list) else [cell["experiment"]]
    return {
        r.seed
        for r in runs
        if set(experiments) & set(r.experiments)
        and r.method == cell["method"]
        and all(dotted_get(r.config, k) == v for k, v in (cell.get("sweep") or {}).items())
    }


def test_every_headline_claim_has_a_faithful_scale_with_three_seeds_per_cell():
    """The faithful miniature (config/miniature.yaml) is the project's statement of the headline claims: each
    has cells at scale `faithful`, every one trained with 3 seeds (docs/miniature.md#seeds)."""
    from dmlrepro.runs import resolve_runs

    claims = {c["id"]: c for c in yaml.safe_load((ROOT / "config" / "claims.yaml").read_text())["claims"]}
    runs = list(resolve_runs(yaml.safe_load((ROOT / "config" / "miniature.yaml").read_text())).values())
    for claim_id in HEADLINE_CLAIMS:
        for side, cell in claims[claim_id]["scales"]["faithful"]["cells"].items():
            assert len(_cell_seeds(runs, cell)) >= 3, (claim_id, side)


def test_every_faithful_claim_gates_every_side_on_learning_and_convergence():
    """A faithful verdict rests on every compared side having learnt (beats_untrained) and stopped at its own
    validation plateau, not the cap (validation_plateau); a check naming one side or cell leaves the others
    unchecked (docs/report.md#mechanism-checks)."""
    claims = yaml.safe_load((ROOT / "config" / "claims.yaml").read_text())["claims"]
    for claim in claims:
        faithful = (claim.get("scales") or {}).get("faithful")
        if faithful is None:
            continue
        every_side = {c["check"] for c in faithful.get("checks", []) if "side" not in c and "cell" not in c}
        assert {"beats_untrained", "validation_plateau"} <= every_side, claim["id"]


def test_the_defaults_table1_cells_have_three_seeds():
    """The default keeps 3 seeds where a t-test is cheapest to show: PFML Table 1 and RSW Table I (the other
    tables 1 seed, for the 10-minute budget: docs/miniature.md#seeds)."""
    claims = {c["id"]: c for c in yaml.safe_load((ROOT / "config" / "claims.yaml").read_text())["claims"]}
    runs = list(_default_runs().values())
    for claim_id in ("pfml-beats-all-table1", "rsw-warp-beats-eq4"):
        for side, cell in claims[claim_id]["scales"]["miniature"]["cells"].items():
            assert len(_cell_seeds(runs, cell)) >= 3, (claim_id, side)


@pytest.mark.parametrize("config", ["config", "miniature", "paper"])
def test_every_asap_table_headlines_asaps_own_method(config):
    """Where an experiment lists a baseline before an ASAP method (C2 before C2-ASAP-L), the summary row is
    the ASAP method's, in every config: the faithful miniature's ASAP Table 1 once showed C2's P@1."""
    experiments = yaml.safe_load((ROOT / "config" / f"{config}.yaml").read_text())["experiments"]
    checked = 0
    for name, experiment in experiments.items():
        methods = experiment.get("methods") or []
        if experiment.get("report") and methods and not methods[0].endswith("_asap"):
            if any(m.endswith("_asap") for m in methods):
                assert experiment["report"].get("headline", "").endswith("_asap"), (config, name)
                checked += 1
    assert checked >= 2, config  # ASAP Table 1 and at least one more (its lr arm, or Tables 2-3)


def test_the_summary_headlines_asaps_own_method():
    """ASAP's tables list the baseline C2 first (ASAP Table 1): the report's summary row is C2-ASAP-L's."""
    experiments = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["experiments"]
    for name in ("asap_table1", "asap_table2", "asap_table3", "asap_fig4a_alternation", "asap_fig8_batch"):
        assert experiments[name]["report"]["headline"] == "c2_asap", name
