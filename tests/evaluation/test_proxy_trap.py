"""The proxy-trap diagnostics (dmlrepro.evaluation.proxy_trap) against independent computations: the
spread by brute force, the zero-gradient share against hand-built fields, Adam's step against the update
torch.optim.Adam actually made; and a short proxies-only PFML training whose proxies are trapped without
clipping and move as the scaling rule assumes with the Proxy-Anchor code's clip_grad_value_(…, 10)."""

import itertools
import math

import numpy as np
import pytest
import torch

from dmlrepro.evaluation.proxy_trap import adam_step_ratio, intra_class_spread, sampler_batches, zero_gradient_share
from dmlrepro.losses import PFMLLoss


def test_the_spread_is_the_median_over_classes_of_the_median_pairwise_distance():
    rng = np.random.default_rng(0)
    proxies, labels = rng.normal(size=(12, 5)), np.repeat([0, 1, 2, 3], 3)
    labels[-3:] = [3, 4, 5]  # classes 3, 4, 5 with one proxy each: left out
    want = []
    for c in (0, 1, 2):
        rows = proxies[labels == c]
        want.append(np.median([np.linalg.norm(a - b) for a, b in itertools.combinations(rows, 2)]))
    assert intra_class_spread(proxies, labels) == pytest.approx(np.median(want), rel=1e-12)
    assert intra_class_spread(proxies[:1], labels[:1]) is None


def test_sampler_batches_draw_classes_times_m():
    labels = np.repeat(np.arange(10), 6)
    for batch in sampler_batches(labels, 16, 4, n_batches=5, seed=3):
        classes, counts = np.unique(labels[batch], return_counts=True)
        assert len(classes) == 4 and set(counts) == {4}
    assert all(len(b) == 16 for b in sampler_batches(labels, 16, None, n_batches=3))


class _Pull(torch.nn.Module):
    """A proxy loss whose gradient is zero exactly for the proxies of the classes absent from the batch."""

    def __init__(self, classes, dim):
        super().__init__()
        self.proxies = torch.nn.Parameter(torch.randn(classes, dim))

    def forward(self, x, y):
        return ((self.proxies[y] - x) ** 2).sum()


def test_the_zero_gradient_share_counts_proxies_without_a_gradient():
    torch.manual_seed(0)
    loss = _Pull(8, 3)
    x, y = np.random.default_rng(0).normal(size=(16, 3)), np.repeat(np.arange(8), 2)
    batches = [np.flatnonzero(y < 2), np.flatnonzero(y < 6)]  # 2 of 8, then 6 of 8 classes present
    assert zero_gradient_share(loss, loss.proxies, x, y, batches) == pytest.approx((6 + 2) / 16)


def test_the_step_ratio_is_the_update_adam_made():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(6, 4))
    lr = 0.03
    opt = torch.optim.Adam([p], lr=lr, betas=(0.9, 0.99))
    for step in range(5):
        before = p.detach().clone()
        opt.zero_grad()
        (p * torch.randn(6, 4) * (step + 1)).sum().backward()
        opt.step()
    made = (p.detach() - before).double().norm(dim=1).median().item() / (lr * math.sqrt(4))
    assert adam_step_ratio(opt, p) == pytest.approx(made, rel=1e-5)
    assert adam_step_ratio(torch.optim.Adam([torch.nn.Parameter(torch.zeros(2, 2))]), p) is None


def _train_proxies(clip):
    """PFML's proxies alone on fixed unit-norm data (the miniature's proxy lr 0.0283, weight decay 5e-4,
    batches of 16 classes × 4): (spread over δ, zero-gradient share, step ratio) after 100 steps."""
    n, per, dim, m = 32, 16, 64, 15
    g = torch.Generator().manual_seed(0)
    mu = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    z = torch.nn.functional.normalize(
        mu.repeat_interleave(per, 0) + 0.06 * torch.randn(n * per, dim, generator=g), dim=1
    )
    y = torch.arange(n).repeat_interleave(per)
    torch.manual_seed(1)
    loss = PFMLLoss(n, dim, m, delta=0.2, alpha=4.0)
    opt = torch.optim.Adam(loss.parameters(), lr=0.0283, weight_decay=5e-4)
    for batch in sampler_batches(y.numpy(), 64, 4, n_batches=100, seed=0):
        opt.zero_grad()
        loss(z[batch], y[batch]).backward()
        if clip:
            torch.nn.utils.clip_grad_value_(loss.parameters(), clip)
        opt.step()
    proxy_labels = torch.arange(n).repeat_interleave(m)
    batches = sampler_batches(y.numpy(), 64, 4, n_batches=20)
    return (
        intra_class_spread(loss.proxies.detach(), proxy_labels) / 0.2,
        zero_gradient_share(loss, loss.proxies, z.numpy(), y.numpy(), batches),
        adam_step_ratio(opt, loss.proxies),
    )


def test_without_clipping_pfmls_proxies_are_trapped_and_clipping_frees_their_steps():
    """The catalogue's proxy_step gate (≥ 0.1 of lr·√D): unclipped proxies fail it, clipped ones pass it. After
    100 steps the other two diagnostics only lean the same way (unclipped: spread 0.71 δ, zero-gradient share
    0.37; clipped: 0.88 δ, 0.28): the step gate is the one that separates the two runs here."""
    spread, zero, step = _train_proxies(None)
    clipped_spread, clipped_zero, clipped_step = _train_proxies(10.0)
    assert spread < 1.0 and step < 0.1
    assert clipped_step > 0.1 and clipped_spread > spread and clipped_zero < zero
