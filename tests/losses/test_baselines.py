"""Every baseline from the factory runs and equals pytorch-metric-learning called directly with the
default hyperparameters written below from the source papers and PML's documentation."""

from __future__ import annotations

import math

import pytest
import torch
from pytorch_metric_learning import losses, miners

from dmlrepro.losses import BASELINES, LOSS_NAMES, build_loss

NUM_CLASSES, DIM = 6, 16

# The default hyperparameters, written from their sources (never read from BASELINES): the PML
# docs' signatures (kevinmusgrave.github.io/pytorch-metric-learning, losses/ and miners/), the ASAP
# paper's App. A.2 where it states them, and where PFML's baselines depart from PML's defaults, the
# Proxy Anchor paper's own training code (Kim et al. 2020), the lineage of PFML's baseline runs
# (docs/losses.md).
DEFAULTS = {
    # ASAP App. A.2: ProxyAnchor (δ, α) = (0.1, 32); PML ProxyAnchorLoss(margin=0.1, alpha=32)
    "proxy_anchor": {"margin": 0.1, "alpha": 32},
    # the Proxy Anchor code's ProxyNCA wrapper: PML ProxyNCALoss with softmax_scale=32 (PML's default is 1)
    "proxy_nca": {"softmax_scale": 32},
    # PML SoftTripleLoss(centers_per_class=10, la=20, gamma=0.1, margin=0.01); ASAP App. A.2 (CUB):
    # (λ, γ, δ) = (20, 0.1, 0.01)
    "soft_triple": {"centers_per_class": 10, "la": 20, "gamma": 0.1, "margin": 0.01},
    # PML MultiSimilarityLoss(alpha=2, beta=50, base=0.5), as the Proxy Anchor code's MS wrapper
    "multi_similarity": {"alpha": 2, "beta": 50, "base": 0.5},
    # the Proxy Anchor code's triplet wrapper: margin 0.1 (PML's default is 0.05), semihard miner
    "triplet": {"margin": 0.1},
    # the Proxy Anchor code's contrastive wrapper: neg_margin 0.5 (PML's default is 1), pos_margin 0
    "contrastive": {"pos_margin": 0.0, "neg_margin": 0.5},
    # PML NormalizedSoftmaxLoss(temperature=0.05)
    "normalized_softmax": {"temperature": 0.05},
    # PML ArcFaceLoss(margin=28.6, scale=64): the margin in degrees (0.5 rad)
    "arcface": {"margin": 28.6, "scale": 64},
    # PML CosFaceLoss(margin=0.35, scale=64)
    "cosface": {"margin": 0.35, "scale": 64},
    # PML NPairsLoss: no hyperparameters
    "npair": {},
}
PML_CLASSES = {
    "proxy_anchor": "ProxyAnchorLoss",
    "proxy_nca": "ProxyNCALoss",
    "soft_triple": "SoftTripleLoss",
    "multi_similarity": "MultiSimilarityLoss",
    "triplet": "TripletMarginLoss",
    "contrastive": "ContrastiveLoss",
    "normalized_softmax": "NormalizedSoftmaxLoss",
    "arcface": "ArcFaceLoss",
    "cosface": "CosFaceLoss",
    "npair": "NPairsLoss",
}
WITH_CLASSES = {"proxy_anchor", "proxy_nca", "soft_triple", "normalized_softmax", "arcface", "cosface"}


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(24, DIM, generator=g), dim=1)
    return z, torch.arange(NUM_CLASSES).repeat(4)


def direct(name, defaults):
    cls = getattr(losses, PML_CLASSES[name])
    loss = cls(NUM_CLASSES, DIM, **defaults) if name in WITH_CLASSES else cls(**defaults)
    if name == "multi_similarity":
        miner = miners.MultiSimilarityMiner(epsilon=0.1)  # PML's default ε, the Proxy Anchor code's
        return lambda z, y: loss(z, y, miner(z, y)), loss
    if name == "triplet":
        miner = miners.TripletMarginMiner(margin=defaults["margin"], type_of_triplets="semihard")
        return lambda z, y: loss(z, y, miner(z, y)), loss
    return loss, loss


def test_every_baseline_has_written_defaults():
    assert set(BASELINES) == set(DEFAULTS)


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_factory_equals_pml(name):
    """build_loss(name) without hyperparameters = PML called with the defaults written above: same
    value and gradients (a changed default, e.g. Proxy-Anchor's α, changes both)."""
    z, y = batch()
    torch.manual_seed(1)
    ours = build_loss(name, NUM_CLASSES, DIM)
    torch.manual_seed(1)
    theirs, theirs_module = direct(name, DEFAULTS[name])
    za, zb = z.clone().requires_grad_(), z.clone().requires_grad_()
    value_ours, value_theirs = ours(za, y), theirs(zb, y)
    assert torch.isfinite(value_ours) and value_ours.item() != 0.0
    assert value_ours.item() == pytest.approx(value_theirs.item(), rel=1e-6)
    value_ours.backward()
    value_theirs.backward()
    torch.testing.assert_close(za.grad, zb.grad)
    assert za.grad.abs().sum() > 0
    for a, b in zip(ours.parameters(), theirs_module.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_defaults_reach_pml(name):
    """The built loss (and miner) hold the written defaults (PML stores ArcFace's margin in radians,
    SoftTriple's γ as its inverse)."""
    built = build_loss(name, NUM_CLASSES, DIM)
    loss = getattr(built, "loss", built)
    stored = {"arcface": {"margin": lambda v: math.degrees(v)}, "soft_triple": {"gamma": lambda v: 1.0 / v}}
    for key, value in DEFAULTS[name].items():
        assert stored.get(name, {}).get(key, lambda v: v)(getattr(loss, key)) == pytest.approx(value, rel=1e-3), key
    if name == "multi_similarity":
        assert built.miner.epsilon == 0.1
    if name == "triplet":
        assert (built.miner.margin, built.miner.type_of_triplets) == (0.1, "semihard")


def test_hyperparameters_reach_pml():
    loss = build_loss("proxy_anchor", NUM_CLASSES, DIM, margin=0.3, alpha=16)
    assert (loss.margin, loss.alpha) == (0.3, 16)
    triplet = build_loss("triplet", NUM_CLASSES, DIM, margin=0.2, miner="hard")
    assert triplet.miner.type_of_triplets == "hard" and triplet.miner.margin == 0.2
    assert isinstance(build_loss("triplet", NUM_CLASSES, DIM, miner=None), losses.TripletMarginLoss)
    assert isinstance(build_loss("multi_similarity", NUM_CLASSES, DIM, miner_epsilon=None), losses.MultiSimilarityLoss)


def test_proxy_nca_paper_form_excludes_target_from_denominator():
    z, y = batch(2)
    loss = build_loss("proxy_nca_paper", NUM_CLASSES, DIM, softmax_scale=3.0)
    p = torch.nn.functional.normalize(loss.proxies.detach().double(), dim=1)
    total = 0.0
    for i in range(len(z)):
        d = [((z[i].double() - p[j]) ** 2).sum() for j in range(NUM_CLASSES)]
        num = torch.exp(-3.0 * d[int(y[i])])
        den = sum(torch.exp(-3.0 * d[j]) for j in range(NUM_CLASSES) if j != int(y[i]))
        total += -torch.log(num / den)
    assert loss(z, y).item() == pytest.approx(float(total) / len(z), rel=1e-5)
    pml_form = build_loss("proxy_nca", NUM_CLASSES, DIM, softmax_scale=3.0)
    with torch.no_grad():
        pml_form.proxies.copy_(loss.proxies)
    assert pml_form(z, y).item() > loss(z, y).item()  # the target in PML's denominator adds to the loss


def test_errors_name_the_loss_and_key():
    with pytest.raises(ValueError, match="unknown loss 'proxy_ancor'"):
        build_loss("proxy_ancor", 3, 4)
    with pytest.raises(TypeError, match="proxy_anchor.*marginn"):
        build_loss("proxy_anchor", 3, 4, marginn=0.1)
    with pytest.raises(TypeError, match="miner"):
        build_loss("contrastive", 3, 4, miner="semihard")


def test_every_name_builds():
    paper = {
        "pfml": {"proxies_per_class": 2},
        "cpml": {"proxies_per_class": 2},
        "rsw": {"alpha": 1.0, "k1": 0.5, "k2": 1.5},
    }
    z, y = batch(3)
    for name in LOSS_NAMES:
        loss = build_loss(name, NUM_CLASSES, DIM, **paper.get(name, {}))
        zr = z.clone().requires_grad_()
        loss(zr, y).backward()
        assert torch.isfinite(zr.grad).all(), name


@pytest.mark.parametrize(
    "name,kwargs,per_class,normalised",
    [
        ("pfml", {"proxies_per_class": 3}, 3, False),
        ("pfml", {"proxies_per_class": 2, "normalize_proxies": True}, 2, True),
        ("rsw", {"alpha": 1.0, "k1": 0.5, "k2": 1.5}, 1, False),
        ("proxy_anchor", {}, 1, True),
        ("proxy_nca", {}, 1, True),
        ("soft_triple", {"centers_per_class": 4}, 4, True),
        ("normalized_softmax", {}, 1, True),
        ("arcface", {}, 1, True),
    ],
)
def test_proxy_points_layout_and_space(name, kwargs, per_class, normalised):
    from dmlrepro.losses import proxy_points

    loss = build_loss(name, NUM_CLASSES, DIM, **kwargs)
    points, labels = proxy_points(loss)
    assert points.shape == (NUM_CLASSES * per_class, DIM)
    assert torch.equal(labels, torch.arange(NUM_CLASSES).repeat_interleave(per_class))
    norms = points.norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms)) == normalised
    if name == "soft_triple":  # centre k of class c is column c·K + k, as PML's get_logits reshapes it
        torch.testing.assert_close(points[1 * per_class + 2], torch.nn.functional.normalize(loss.fc[:, 6], dim=0))


def test_losses_without_proxies_say_so():
    from dmlrepro.losses import proxy_points

    with pytest.raises(ValueError, match="no proxies"):
        proxy_points(build_loss("triplet", NUM_CLASSES, DIM))
