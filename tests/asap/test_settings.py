"""Per-dataset ASAP settings against the ASAP paper's App. A.2, written out below, and the S /
Loss-Proxy readings (ASAP-R15, ASAP-R16)."""

import pytest

from dmlrepro.asap import asap_settings
from dmlrepro.losses import build_loss

# ASAP App. A.2, "Training procedure" (E: validation every 25 steps on CUB / Cars196, 250 on
# SOP / InShop) and "ASAP" (P = 8 proxies per class, λ = 2·10⁻⁴, pool size b = 12 on CUB / Cars;
# P = 4, λ = 2·10⁻⁴, b = 7 on SOP / InShop)
SCHEDULE = {"cub": (25, 8, 12, 2e-4), "cars": (25, 8, 12, 2e-4), "inshop": (250, 4, 7, 2e-4), "sop": (250, 4, 7, 2e-4)}
# ASAP App. A.2, "Hyperparameters", per dataset in the order CUB, Cars196, InShop, SOP:
# C1 margin 0.5 for all; C2 (m⁺, m⁻); Triplet margin; MS (α, β, λ) (λ: PML's `base`)
LOSSES = {
    "c1": {d: {"margin": 0.5} for d in ("cub", "cars", "inshop", "sop")},
    "c2": {
        "cub": {"pos_margin": 0.0, "neg_margin": 0.3841},
        "cars": {"pos_margin": 0.2652, "neg_margin": 0.5409},
        "inshop": {"pos_margin": 0.2858, "neg_margin": 0.5130},
        "sop": {"pos_margin": 0.2858, "neg_margin": 0.5130},
    },
    "triplet": {
        "cub": {"margin": 0.0961},
        "cars": {"margin": 0.1190},
        "inshop": {"margin": 0.0451},
        "sop": {"margin": 0.0451},
    },
    "ms": {
        "cub": {"alpha": 2.0, "beta": 40.0, "base": 0.5},
        "cars": {"alpha": 14.35, "beta": 75.83, "base": 0.66},
        "inshop": {"alpha": 8.49, "beta": 57.38, "base": 0.41},
        "sop": {"alpha": 2.0, "beta": 40.0, "base": 0.5},
    },
}


@pytest.mark.parametrize("dataset", sorted(SCHEDULE))
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_values_of_the_paper(dataset, loss):
    eval_every, proxies, pool, lam = SCHEDULE[dataset]
    got = asap_settings(dataset, loss)
    assert got["loss_name"] == f"asap_{loss}"
    assert (got["eval_every"], got["b"], got["lam"], got["alternate"]) == (eval_every, pool, lam, True)
    assert got["loss_hparams"] == {**LOSSES[loss][dataset], "proxies_per_class": proxies}
    # "Solving projections": early-stopping patience 3 per projection; A.2: stop after 60 steps without gain
    assert (got["projection_patience"], got["global_patience"]) == (3, 60)


def test_variants():
    s = asap_settings("cub", "c1", "S")
    assert s["loss_hparams"]["proxies_per_class"] == 1 and s["b"] == 12  # ASAP-R15
    p = asap_settings("cub", "c1", "proxy")
    assert p["loss_hparams"]["proxies_per_class"] == 8 and p["lam"] == 0.0 and not p["alternate"]  # ASAP-R16
    plain = asap_settings("sop", "triplet", "plain")
    assert plain["loss_name"] == "pair_triplet" and "b" not in plain
    loss = build_loss(p["loss_name"], 10, 16, **p["loss_hparams"])
    assert loss.proxies.shape == (80, 16)
    with pytest.raises(ValueError):
        asap_settings("mnist", "c2")
