"""The proximal term λ/2‖θ − θ*‖²: gradient λ(θ − θ*) on network weights, proxies untouched."""

import pytest
import torch
from torch import nn

from dmlrepro.asap import ProximalRegularizer
from dmlrepro.losses import ASAPLoss


def _net(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.BatchNorm1d(6), nn.Linear(6, 3)).double()
    net[2].weight.requires_grad_(False)  # a frozen parameter is not regularised
    return net


def _move(net, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


def test_penalty_gradient_equals_formula_float64():
    net = _net()
    reg = ProximalRegularizer(net, lam=2e-4)
    anchor = [p.detach().clone() for p in net.parameters() if p.requires_grad]
    _move(net, 1)
    trainable = [p for p in net.parameters() if p.requires_grad]
    grads = torch.autograd.grad(reg.penalty(), trainable)
    for g, p, a in zip(grads, trainable, anchor):
        torch.testing.assert_close(g, 2e-4 * (p.detach() - a), rtol=1e-12, atol=0)
    value = 0.5 * 2e-4 * sum(float(((p - a) ** 2).sum()) for p, a in zip(trainable, anchor))
    assert float(reg.penalty()) == pytest.approx(value, rel=1e-12)
    assert reg.distance() == pytest.approx((value / 1e-4) ** 0.5, rel=1e-12)


def test_add_to_grad_equals_autograd_of_penalty():
    net = _net()
    reg = ProximalRegularizer(net, lam=0.37)
    _move(net, 2)
    x = torch.randn(4, 5, dtype=torch.float64)
    net(x).square().sum().backward()
    task = [p.grad.clone() for p in reg.params]
    reg.add_to_grad()
    via_hook = [p.grad.clone() for p in reg.params]
    net.zero_grad()
    (net(x).square().sum() + reg.penalty()).backward()
    for h, p, t, a in zip(via_hook, reg.params, task, reg.anchor):
        torch.testing.assert_close(h, p.grad, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(h - t, 0.37 * (p.detach() - a), rtol=1e-12, atol=1e-15)
    assert net[2].weight.grad is None  # frozen: never touched


def test_proxies_are_left_alone():
    net = _net()
    loss = ASAPLoss("c2", 3, 3, proxies_per_class=2)
    loss.double()
    reg = ProximalRegularizer(net, lam=1.0, exclude=loss.parameters())
    assert all(p is not loss.proxies for p in reg.params)
    _move(net, 3)
    with torch.no_grad():
        loss.proxies.add_(1.0)  # far from anything: a proximal term on proxies would show
    x, y = torch.randn(6, 5, dtype=torch.float64), torch.tensor([0, 0, 1, 1, 2, 2])
    loss(net(x), y).backward()
    g_plain = loss.proxies.grad.clone()
    reg.add_to_grad()
    torch.testing.assert_close(loss.proxies.grad, g_plain, rtol=0, atol=0)
    loss.proxies.grad = None
    (loss(net(x), y) + reg.penalty()).backward()
    torch.testing.assert_close(loss.proxies.grad, g_plain, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="proxies"):
        ProximalRegularizer([*net.parameters(), loss.proxies], exclude=[loss.proxies])


def test_snapshot_capture_and_lambda_zero():
    net = _net()
    reg = ProximalRegularizer(net, lam=1e-2)
    _move(net, 4)
    best = reg.capture()  # best-in-projection θ (ASAP-R4)
    _move(net, 5)
    reg.snapshot(best)  # θ* ← θ_bp, the live θ keeps its value
    for a, b in zip(reg.anchor, best):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert float(reg.penalty()) > 0
    reg.snapshot()  # θ* ← current θ
    assert float(reg.penalty()) == 0.0
    _move(net, 6)
    reg.lam = 0.0  # λ_eff = 0 in the first projection (ASAP-R3)
    for p in reg.params:
        p.grad = torch.zeros_like(p)
    reg.add_to_grad()
    assert all(float(p.grad.abs().sum()) == 0 for p in reg.params)
    assert float(reg.penalty()) == 0.0
    state = reg.state_dict()
    other = ProximalRegularizer(_net(1), lam=5.0)
    other.load_state_dict(state)
    assert other.lam == 0.0 and all(torch.equal(a, b) for a, b in zip(other.anchor, reg.anchor))
    with pytest.raises(ValueError):
        reg.snapshot(best[:-1])
