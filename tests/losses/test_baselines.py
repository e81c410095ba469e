"""Every baseline from the factory runs and equals pytorch-metric-learning called directly."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning import losses, miners

from dmlrepro.losses import BASELINES, LOSS_NAMES, build_loss

NUM_CLASSES, DIM = 6, 16


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.nn.functional.normalize(torch.randn(24, DIM, generator=g), dim=1)
    return z, torch.arange(NUM_CLASSES).repeat(4)


def direct(name, defaults):
    spec = BASELINES[name]
    cls = getattr(losses, spec.pml_class)
    loss = cls(NUM_CLASSES, DIM, **defaults) if spec.has_classes else cls(**defaults)
    if name == "multi_similarity":
        miner = miners.MultiSimilarityMiner(epsilon=0.1)
        return lambda z, y: loss(z, y, miner(z, y)), loss
    if name == "triplet":
        miner = miners.TripletMarginMiner(margin=defaults["margin"], type_of_triplets="semihard")
        return lambda z, y: loss(z, y, miner(z, y)), loss
    return loss, loss


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_factory_equals_pml(name):
    z, y = batch()
    torch.manual_seed(1)
    ours = build_loss(name, NUM_CLASSES, DIM)
    torch.manual_seed(1)
    theirs, theirs_module = direct(name, BASELINES[name].defaults)
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
    paper = {"pfml": {"proxies_per_class": 2}, "cpml": {"proxies_per_class": 2},
             "rsw": {"alpha": 1.0, "k1": 0.5, "k2": 1.5}}
    z, y = batch(3)
    for name in LOSS_NAMES:
        loss = build_loss(name, NUM_CLASSES, DIM, **paper.get(name, {}))
        zr = z.clone().requires_grad_()
        loss(zr, y).backward()
        assert torch.isfinite(zr.grad).all(), name


@pytest.mark.parametrize("name,kwargs,per_class,normalised", [
    ("pfml", {"proxies_per_class": 3}, 3, False), ("pfml", {"proxies_per_class": 2, "normalize_proxies": True}, 2, True),
    ("rsw", {"alpha": 1.0, "k1": 0.5, "k2": 1.5}, 1, False), ("proxy_anchor", {}, 1, True), ("proxy_nca", {}, 1, True),
    ("soft_triple", {"centers_per_class": 4}, 4, True), ("normalized_softmax", {}, 1, True), ("arcface", {}, 1, True),
])
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
