"""C1, C2, MS, Triplet on proxy–sample pairs (ASAP) and batch pairs, against the float64 double loops
of asap_reference.py (values and gradients), plus library oracles (pytorch-metric-learning)."""

import pytest
import torch

from dmlrepro.losses import build_loss
from dmlrepro.losses.asap import ASAP_LOSSES, ASAPLoss, PairLoss
from dmlrepro.losses.pair_bases import BASES

import asap_reference as ref

pytestmark = pytest.mark.usefixtures("float64_default")  # tests/conftest.py

C, P, D = 3, 2, 4


def _batch(seed, m=8, scale=0.6):
    g = torch.Generator().manual_seed(seed)
    # norms straddle 1, so both branches of 𝒩 are exercised
    emb = (torch.randn(m, D, generator=g) * scale).requires_grad_()
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1][:m])
    proxies = torch.randn(C * P, D, generator=g) * scale
    return emb, labels, proxies


# hyperparameters chosen so that every hinge / filter is active for some pairs and not for others
CASES = {
    "c1": [{"margin": 0.2}, {"margin": 0.2, "reduction": "mean"}],
    "c2": [{"pos_margin": 0.1, "neg_margin": 0.9}, {"pos_margin": 0.0, "neg_margin": 0.8, "reduction": "mean"}],
    "ms": [
        {"alpha": 2.0, "beta": 10.0, "base": 0.3},
        {"alpha": 2.0, "beta": 10.0, "base": 0.3, "mining": True, "epsilon": 0.3},
    ],
    "triplet": [{"margin": 0.3}, {"margin": 0.3, "reduction": "mean"}],
}


def _reference(base, hp, anchors, a_lab, refs, r_lab, exclude_self):
    hp = dict(hp)
    if base == "c1":
        return ref.c1(
            anchors,
            a_lab,
            refs,
            r_lab,
            hp["margin"],
            exclude_self=exclude_self,
            reduction=hp.get("reduction", "anchor"),
        )
    if base == "c2":
        return ref.c2(
            anchors,
            a_lab,
            refs,
            r_lab,
            hp["pos_margin"],
            hp["neg_margin"],
            exclude_self=exclude_self,
            reduction=hp.get("reduction", "nonzero"),
        )
    if base == "ms":
        return ref.ms(
            anchors,
            a_lab,
            refs,
            r_lab,
            hp["alpha"],
            hp["beta"],
            hp["base"],
            exclude_self=exclude_self,
            mining=hp.get("mining", False),
            epsilon=hp.get("epsilon", 0.1),
        )
    return ref.triplet(
        anchors, a_lab, refs, r_lab, hp["margin"], exclude_self=exclude_self, reduction=hp.get("reduction", "nonzero")
    )


def _cases():
    for base, hps in CASES.items():
        for i, hp in enumerate(hps):
            yield pytest.param(base, hp, id=f"{base}-{i}")


@pytest.mark.parametrize("base,hp", list(_cases()))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_asap_loss_matches_double_loop(base, hp, seed):
    emb, labels, proxies = _batch(seed)
    loss = ASAPLoss(base, C, D, proxies_per_class=P, **hp)
    loss.set_proxies(proxies.view(C, P, D))
    value = loss(emb, labels)
    g_emb, g_prox = torch.autograd.grad(value, [emb, loss.proxies])

    emb_r = emb.detach().clone().requires_grad_()
    prox_r = proxies.clone().requires_grad_()
    anchors = [ref.lip(emb_r[i]) for i in range(len(emb_r))]
    refs = [ref.lip(prox_r[j]) for j in range(C * P)]
    r_lab = [j // P for j in range(C * P)]  # row c·P + k is proxy k of class c
    expected = _reference(base, hp, anchors, labels, refs, r_lab, exclude_self=False)
    e_emb, e_prox = torch.autograd.grad(expected, [emb_r, prox_r])
    assert float(value) > 0
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_emb, e_emb, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(g_prox, e_prox, rtol=1e-8, atol=1e-10)
    assert g_prox.abs().sum() > 0


@pytest.mark.parametrize("base,hp", list(_cases()))
@pytest.mark.parametrize("seed", [0, 3])
def test_pair_loss_matches_double_loop(base, hp, seed):
    emb, labels, _ = _batch(seed)
    value = PairLoss(base, **hp)(emb, labels)
    (g,) = torch.autograd.grad(value, [emb])
    emb_r = emb.detach().clone().requires_grad_()
    x = [ref.lip(emb_r[i]) for i in range(len(emb_r))]
    expected = _reference(base, hp, x, labels, x, labels, exclude_self=True)
    (e,) = torch.autograd.grad(expected, [emb_r])
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g, e, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("base", ["ms", "triplet"])
def test_proxy_anchor_role(base):
    """ASAP-R9 'proxy': proxies are the anchors and batch samples the references."""
    hp = CASES[base][0]
    emb, labels, proxies = _batch(5)
    loss = ASAPLoss(base, C, D, proxies_per_class=P, anchor="proxy", **hp)
    loss.set_proxies(proxies)
    anchors = [ref.lip(proxies[j]) for j in range(C * P)]
    refs = [ref.lip(emb[i].detach()) for i in range(len(emb))]
    expected = _reference(base, hp, anchors, [j // P for j in range(C * P)], refs, labels, exclude_self=False)
    torch.testing.assert_close(loss(emb, labels), expected, rtol=1e-10, atol=1e-12)


def test_batch_pair_weight_adds_in_batch_term():
    """ASAP-R2: loss = proxy_weight·L(batch, proxies) + batch_pair_weight·L(batch, batch)."""
    hp = CASES["c2"][0]
    emb, labels, proxies = _batch(7)
    mixed = ASAPLoss("c2", C, D, proxies_per_class=P, batch_pair_weight=0.1, proxy_weight=1.0, **hp)
    mixed.set_proxies(proxies)
    x = [ref.lip(emb[i].detach()) for i in range(len(emb))]
    refs = [ref.lip(proxies[j]) for j in range(C * P)]
    r_lab = [j // P for j in range(C * P)]
    expected = ref.c2(x, labels, refs, r_lab, hp["pos_margin"], hp["neg_margin"]) + 0.1 * ref.c2(
        x, labels, x, labels, hp["pos_margin"], hp["neg_margin"], exclude_self=True
    )
    torch.testing.assert_close(mixed(emb, labels), expected, rtol=1e-10, atol=1e-12)


def test_c2_is_generalized_contrastive_of_eq_4_2():
    """(ι(d − β) + α)_+ with β = (m⁺+m⁻)/2, α = (m⁻−m⁺)/2 (CUB margins), one pair of each kind."""
    loss = ASAPLoss("c2", 2, 2, proxies_per_class=1, pos_margin=0.0, neg_margin=0.3841, reduction="mean")
    loss.set_proxies(torch.tensor([[0.0, 0.0], [0.5, 0.0]]))
    emb = torch.tensor([[0.3, 0.0]])
    beta = alpha = 0.19205
    d_pos, d_neg = 0.3, 0.2
    expected = (max(0.0, d_pos - beta + alpha) + max(0.0, -(d_neg - beta) + alpha)) / 2
    assert abs(float(loss(emb, torch.tensor([0]))) - expected) < 1e-12


def test_pair_losses_match_pytorch_metric_learning_on_l2():
    """With hard L2 normalisation, C2 / Triplet / MS equal PML's ContrastiveLoss, TripletMarginLoss
    (all triplets) and MultiSimilarityLoss (no miner) — a library oracle for the reductions."""
    from pytorch_metric_learning import losses as pml

    emb, labels, _ = _batch(11, scale=1.0)
    emb = emb.detach()
    pairs = [
        (
            PairLoss("c2", normalize="l2", pos_margin=0.2, neg_margin=1.1),
            pml.ContrastiveLoss(pos_margin=0.2, neg_margin=1.1),
        ),
        (PairLoss("triplet", normalize="l2", margin=0.3), pml.TripletMarginLoss(margin=0.3)),
        (
            PairLoss("ms", normalize="l2", alpha=2.0, beta=10.0, base=0.3),
            pml.MultiSimilarityLoss(alpha=2.0, beta=10.0, base=0.3),
        ),
    ]
    for ours, theirs in pairs:
        torch.testing.assert_close(ours(emb, labels), theirs(emb, labels), rtol=1e-9, atol=1e-12)


def test_lipschitz_normalisation_inside_loss():
    """Scaling every vector inside the unit ball changes the loss (𝒩 keeps short vectors), beyond it not."""
    emb, labels, proxies = _batch(2)
    loss = ASAPLoss("c2", C, D, proxies_per_class=P, **CASES["c2"][0])
    loss.set_proxies(proxies * 100)
    far = loss(emb.detach() * 100, labels)
    torch.testing.assert_close(loss(emb.detach() * 200, labels), far)
    small = loss(emb.detach() * 1e-3, labels)
    assert abs(float(small) - float(far)) > 1e-3


def test_registry_and_errors():
    assert set(ASAP_LOSSES) == {f"{k}_{b}" for k in ("asap", "pair") for b in BASES}
    loss = build_loss("asap_c2", 5, 16, proxies_per_class=3)
    assert loss.proxies.shape == (15, 16)
    assert loss.proxy_labels.tolist() == [c for c in range(5) for _ in range(3)]
    with pytest.raises(ValueError, match="unknown loss 'asap_nca'"):
        build_loss("asap_nca", 5, 16)
    with pytest.raises(TypeError, match="bad hyperparameters"):
        build_loss("asap_c2", 5, 16, margin=0.1)
    with pytest.raises(ValueError, match="reduction"):
        build_loss("pair_ms", 5, 16, reduction="nonzero")
    with pytest.raises(ValueError, match="anchor"):
        build_loss("asap_ms", 5, 16, anchor="both")
