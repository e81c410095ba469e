"""Per-dataset ASAP settings (paper A.2 / spec §2.6) and the S / Loss-Proxy readings (A15, A16)."""

import pytest

from dmlrepro.asap import asap_settings, build_asap_loss


def test_values_of_the_paper():
    cub = asap_settings("cub", "c2")
    assert cub["loss_hparams"]["proxies_per_class"] == 8
    assert cub["b"] == 12 and cub["lam"] == 2e-4 and cub["eval_every"] == 25
    assert cub["loss_hparams"]["neg_margin"] == 0.3841 and cub["loss_hparams"]["pos_margin"] == 0.0
    sop = asap_settings("sop", "ms")
    assert sop["b"] == 7 and sop["eval_every"] == 250 and sop["loss_hparams"]["proxies_per_class"] == 4
    assert asap_settings("cars", "ms")["loss_hparams"]["alpha"] == 14.35
    assert asap_settings("inshop", "triplet")["loss_hparams"]["margin"] == 0.0451
    assert asap_settings("cars", "c2")["loss_hparams"]["pos_margin"] == 0.2652


def test_variants():
    s = asap_settings("cub", "c1", "S")
    assert s["loss_hparams"]["proxies_per_class"] == 1 and s["b"] == 12          # A15
    p = asap_settings("cub", "c1", "proxy")
    assert p["loss_hparams"]["proxies_per_class"] == 8 and p["lam"] == 0.0 and not p["alternate"]   # A16
    plain = asap_settings("sop", "triplet", "plain")
    assert plain["loss_name"] == "pair_triplet" and "b" not in plain
    loss = build_asap_loss(p["loss_name"], 10, 16, **p["loss_hparams"])
    assert loss.proxies.shape == (80, 16)
    with pytest.raises(ValueError):
        asap_settings("mnist", "c2")
