"""HIST against a literal float64 evaluation of the official code's loss (code/hist.py, code/train.py):
element-wise loops, explicit diagonal degree matrices, BatchNorm written out; values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from dmlrepro.losses import HISTLoss, build_loss


def problem(seed=0, batch=8, classes=5, dim=6, hidden=7):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, dim, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, classes, (batch,), generator=g)
    y[:2] = torch.tensor([0, 0])  # at least one class twice
    loss = HISTLoss(classes, dim, tau=3.0, alpha=0.7, lambda_s=1.5, hgnn_hidden=hidden).double()
    with torch.no_grad():  # log-variances across relu6's kinks: below 0, inside, above 6
        loss.log_vars.copy_(torch.randn(classes, dim, generator=g, dtype=torch.float64) * 4 + 1)
        loss.log_vars[0, :2] = torch.tensor([7.5, -2.0], dtype=torch.float64)
        loss.hgnn.bn1.weight.copy_(torch.rand(hidden, generator=g, dtype=torch.float64) + 0.5)
        loss.hgnn.bn1.bias.copy_(torch.randn(hidden, generator=g, dtype=torch.float64))
    return loss, x, y


def unit(v):
    return v / torch.sqrt(sum(a**2 for a in v))


def literal(loss: HISTLoss, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The official forward pass, one scalar at a time."""
    n, c = x.shape[0], loss.num_classes
    xs = [unit(x[i]) for i in range(n)]
    mus = [unit(loss.means[k]) for k in range(c)]
    var = [[torch.exp(torch.clamp(loss.log_vars[k, f], 0.0, 6.0)) for f in range(x.shape[1])] for k in range(c)]
    d = [[sum((xs[i][f] - mus[k][f]) ** 2 / var[k][f] for f in range(x.shape[1])) for k in range(c)] for i in range(n)]
    # distribution loss: softmax over classes, the true class's probability, -log, mean over non-zero rows
    terms = []
    for i in range(n):  # F.softmax: shifted by the row's largest logit
        top = max(-loss.tau * d[i][k] for k in range(c)).detach()
        z = sum(torch.exp(-loss.tau * d[i][k] - top) for k in range(c))
        p = torch.exp(-loss.tau * d[i][int(y[i])] - top) / z
        if float(p) != 0.0:
            terms.append(-torch.log(p))
    dist_loss = sum(terms) / len(terms)
    # incidence over the classes present in the batch, in class order
    present = sorted({int(v) for v in y})
    h = torch.stack(
        [
            torch.stack(
                [torch.ones((), dtype=x.dtype) if int(y[i]) == k else torch.exp(-loss.alpha * d[i][k]) for k in present]
            )
            for i in range(n)
        ]
    )
    dv = torch.diag(h.sum(dim=1) ** -0.5)
    de = torch.diag(h.sum(dim=0) ** -1)
    g = dv @ h @ torch.eye(len(present), dtype=x.dtype) @ de @ h.t() @ dv
    t1, bn, t2 = loss.hgnn.theta1, loss.hgnn.bn1, loss.hgnn.theta2
    a = g @ (x @ t1.weight.t() + t1.bias)
    mean = a.mean(dim=0)
    var_b = ((a - mean) ** 2).mean(dim=0)  # BatchNorm1d in training mode: biased batch variance
    a = (a - mean) / torch.sqrt(var_b + bn.eps) * bn.weight + bn.bias
    a = torch.where(a > 0, a, 0.1 * a)
    logits = g @ (a @ t2.weight.t() + t2.bias)
    ce = sum(torch.logsumexp(logits[i], 0) - logits[i, int(y[i])] for i in range(n)) / n
    return dist_loss + loss.lambda_s * ce


def grads(value, loss, x):
    return torch.autograd.grad(value, [x, *loss.parameters()])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hist_equals_the_literal_official_loss(seed):
    loss, x, y = problem(seed)
    xr = x.clone().requires_grad_()
    value = loss(xr, y)
    ref = literal(loss, xr, y)
    assert torch.allclose(value, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads(value, loss, xr), grads(ref, loss, xr)):
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)
    assert (loss.log_vars < 0).any() and (loss.log_vars > 6).any()  # relu6's flat parts were exercised


def test_rows_whose_probability_underflows_are_dropped():
    loss, x, y = problem(0)
    loss.tau = 1.0e4  # exp(-τ·d) underflows for every class but the nearest: wrong-class rows give p = 0
    xr = x.clone().requires_grad_()
    dist_loss, _ = loss.distributions(xr, y)
    ref = literal(loss, xr, y)  # the literal reference drops them too
    assert math.isfinite(float(dist_loss)) and torch.allclose(loss(xr, y), ref, rtol=1e-12)


def test_incidence_is_one_for_the_own_class_and_exp_elsewhere():
    loss, x, y = problem(1)
    _, h = loss.distributions(x, y)
    present = sorted({int(v) for v in y})
    assert h.shape == (len(y), len(present))
    for i, label in enumerate(y.tolist()):
        for j, k in enumerate(present):
            assert (float(h[i, j]) == 1.0) if label == k else (0.0 < float(h[i, j]) < 1.0)


def test_build_loss_defaults_are_the_official_argparse_defaults():
    loss = build_loss("hist", 10, 16)
    assert (loss.tau, loss.alpha, loss.lambda_s, loss.hgnn_lr_factor) == (32.0, 0.9, 1.0, 10.0)
    assert loss.hgnn.theta1.out_features == 512 and loss.hgnn.theta2.out_features == 10
    assert loss.means.std().item() == pytest.approx(math.sqrt(2 / 10), rel=0.15)  # kaiming fan_out: fan_out = C
    [(params, group, ratio)] = loss.linked_lr_groups().values()
    assert group == "backbone" and ratio == 10.0
    assert {id(p) for p in params} == {id(p) for p in loss.hgnn.parameters()}


def test_a_sample_whose_p_is_tiny_but_not_zero_has_a_finite_gradient():
    """p_true = e^-96 (a float32 subnormal, not 0: the code keeps the sample) gave log's gradient 1/p = inf
    in the code's -log p (the faithful miniature's HIST runs diverged at their fifth step); the loss is the
    float64 -log p averaged with the other sample's."""
    loss = HISTLoss(num_classes=2, embedding_size=2, tau=32.0)
    with torch.no_grad():
        loss.means.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
        loss.log_vars.zero_()  # unit variances: the distance is the squared Euclidean one of the unit vectors
    cos = -0.75  # d_true - d_other = -4 cos = 3, so p_true = 1 / (1 + e^(32 * 3))
    x = torch.tensor([[cos, math.sqrt(1 - cos**2)], [1.0, 0.1]], requires_grad=True)
    labels = torch.tensor([0, 0])
    distribution_loss, _ = loss.distributions(x, labels)
    distribution_loss.backward()
    assert torch.isfinite(x.grad).all()
    d = [torch.tensor(r, dtype=torch.float64) / torch.tensor(r, dtype=torch.float64).norm() for r in x.tolist()]
    means = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    minus_log_p = [
        torch.logsumexp(-32.0 * ((v - means) ** 2).sum(1), 0) + 32.0 * ((v - means[0]) ** 2).sum() for v in d
    ]
    assert distribution_loss.item() == pytest.approx(float(sum(minus_log_p) / 2), rel=1e-5)
