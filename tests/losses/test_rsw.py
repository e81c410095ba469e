"""RSW against literal float64 evaluations of eqs. 4, 7 and 8 (and the identities they imply)."""

from __future__ import annotations

import math

import pytest
import torch

from dmlrepro.losses import RSW_FUNCTIONS, RSWLoss

from brute_force import rsw_sample_loss

# eq. 7's identity warp, for the alpha, k1, k2 that a Table III row leaves out (V1–V4 use none of them)
IDENTITY_WARP = {"alpha": 0.0, "k1": 1.0, "k2": 1.0}


def problem(seed=0, batch=6, classes=5, dim=4, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(batch, dim, generator=g, dtype=torch.float64) * spread
    y = torch.randint(0, classes, (batch,), generator=g)
    p = torch.randn(classes, dim, generator=g, dtype=torch.float64) * spread
    return e, y, p


def module(p, **kwargs):
    loss = RSWLoss(p.shape[0], p.shape[1], **kwargs).double()
    with torch.no_grad():
        loss.proxies.copy_(p)
    return loss


def literal(e, y, p, f1, f2, s):
    er, pr = e.clone().requires_grad_(), p.clone().requires_grad_()
    value = sum(rsw_sample_loss(er[i], int(y[i]), pr, f1, f2, s) for i in range(len(e))) / len(e)
    return value, *torch.autograd.grad(value, [er, pr])


def eq7(alpha, k1, k2, k=1.0, delta=True):
    def f1(t):
        if t < alpha:
            return k1 * t + (k * (1 - k1) * t.detach() if delta else 0.0)
        return k2 * t + (1 - k2) * alpha

    return f1


def run(loss, e, y):
    er = e.clone().requires_grad_()
    value = loss(er, y)
    value.backward()
    return value, er.grad, loss.proxies.grad


def identity(t):
    return t


@pytest.mark.parametrize(
    "alpha,k1,k2,k,s",
    [(3.0, 0.4, 1.6, 1.0, 1.0), (10.0, 0.25, 2.25, 1.5, 0.7), (0.0, 0.9, 1.2, 1.0, 2.0), (100.0, 0.8, 1.15, 1.3, 4.5)],
)
def test_rsw_equals_literal_eq8(alpha, k1, k2, k, s):
    e, y, p = problem()
    value, ge, gp = run(module(p, alpha=alpha, k1=k1, k2=k2, scale=s, delta_scale=k), e, y)
    ref, ref_ge, ref_gp = literal(e, y, p, eq7(alpha, k1, k2, k), identity, s)
    assert value.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(ge, ref_ge, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gp, ref_gp, rtol=1e-10, atol=1e-12)


def test_both_branches_are_exercised():
    e, y, p = problem()
    t1 = torch.cdist(e, p).gather(1, y[:, None])
    assert (t1 < 10.0).any() and (t1 >= 10.0).any()  # the (10.0, ...) case above hits both branches


@pytest.mark.parametrize("alpha", [0.0, 2.0, 1e6])
def test_k1_k2_one_is_eq4(alpha):
    e, y, p = problem(1)
    warped = run(module(p, alpha=alpha, k1=1.0, k2=1.0, scale=1.3), e, y)
    eq4 = run(module(p, alpha=alpha, k1=0.5, k2=2.0, scale=1.3, warp=False), e, y)
    for a, b in zip(warped, eq4):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    ref, ref_ge, _ = literal(e, y, p, identity, identity, 1.3)
    assert eq4[0].item() == pytest.approx(ref.item(), rel=1e-12)


def test_inside_alpha_value_is_eq4_but_gradient_scaled_by_k1():
    """With Δ (k = 1) the value equals eq. 4 inside α; the analytic gradients ∂L/∂t_y = s·f1'·(1 − p_y),
    ∂L/∂t_j = −s·p_j."""
    e, y, p = problem(2)
    k1, s = 0.3, 1.7
    value, ge, _ = run(module(p, alpha=1e6, k1=k1, k2=1.5, scale=s), e, y)
    eq4, _, _ = run(module(p, alpha=1e6, k1=k1, k2=1.5, scale=s, warp=False), e, y)
    assert value.item() == pytest.approx(eq4.item(), rel=1e-12)
    t = torch.cdist(e, p)
    prob = torch.softmax(-s * t, dim=1)  # forward values equal eq. 4's
    dl_dt = -s * prob
    gt = torch.arange(len(e)), y
    dl_dt[gt] = s * k1 * (1 - prob[gt])
    unit = (e[:, None, :] - p[None, :, :]) / t[..., None]  # ∂t_ij/∂e_i
    analytic = (dl_dt[..., None] * unit).sum(1) / len(e)
    torch.testing.assert_close(ge, analytic, rtol=1e-10, atol=1e-12)


def test_alpha_zero_is_k2_times_t():
    loss = RSWLoss(3, 2, alpha=0.0, k1=0.5, k2=1.7)
    t = torch.tensor([[0.0], [0.3], [2.0], [40.0]])
    torch.testing.assert_close(loss.warp_ground_truth(t), 1.7 * t)


def test_continuous_at_alpha_only_when_delta_multiplier_is_one():
    t = torch.tensor([[4.0 - 1e-9], [4.0]], dtype=torch.float64)
    f = RSWLoss(3, 2, alpha=4.0, k1=0.25, k2=2.25).warp_ground_truth(t)
    assert f[0].item() == pytest.approx(f[1].item(), abs=1e-8)
    jump = RSWLoss(3, 2, alpha=4.0, k1=0.25, k2=2.25, delta_scale=1.5).warp_ground_truth(t)
    assert jump[0].item() - jump[1].item() == pytest.approx(0.5 * 0.75 * 4.0, rel=1e-6)  # (k−1)(1−k1)α


def test_matches_official_code_formulation():
    """The official Model.py form: mask·(k1·d + margin·(1−k1)·sg(d)) + (1−mask)·(k2·d + α(1−k2)), ×temp, log_softmax."""
    e, y, p = problem(3)
    temp, alpha, k1, k2, margin = 4.525, 4.0, 0.93, 1.15, 1.3
    loss = module(p, alpha=alpha, k1=k1, k2=k2, scale=temp, delta_scale=margin)
    value, ge, gp = run(loss, e, y)
    er, pr = e.clone().requires_grad_(), p.clone().requires_grad_()
    d2 = (er * er).sum(1, keepdim=True) + (pr * pr).sum(1)[None] - 2 * er @ pr.T
    dist = d2.clamp(min=1e-12).sqrt()
    onehot = torch.nn.functional.one_hot(y, len(p)).double()
    d_pos = (dist * onehot).sum(1, keepdim=True)
    mask = (d_pos < alpha).double().detach()
    warped_pos = mask * (k1 * d_pos + margin * (1 - k1) * d_pos.detach()) + (1 - mask) * (k2 * d_pos + alpha * (1 - k2))
    warped = dist * (1 - onehot) + warped_pos * onehot
    official = -(torch.log_softmax(-temp * warped, dim=1) * onehot).sum(1).mean()
    assert value.item() == pytest.approx(official.item(), rel=1e-12)
    g_e, g_p = torch.autograd.grad(official, [er, pr])
    torch.testing.assert_close(ge, g_e)
    torch.testing.assert_close(gp, g_p)


@pytest.mark.parametrize("name", sorted(RSW_FUNCTIONS))
def test_table3_functions_equal_their_printed_form(name):
    e, y, p = problem(4, spread=1.0)
    s = 0.8
    loss = module(p, **{**IDENTITY_WARP, **RSW_FUNCTIONS[name]}, scale=s)
    value, ge, _ = run(loss, e, y)
    spec = RSW_FUNCTIONS[name]
    if spec["function"] == "power":
        f1 = f2 = lambda t, w=spec["power"]: t**w  # noqa: E731
    elif math.isinf(spec["alpha"]):  # V5/V6: k1·t1 with no Δ, as printed
        f1, f2 = (lambda t, c=spec["k1"]: c * t), identity
    else:
        f1, f2 = eq7(spec["alpha"], spec["k1"], spec["k2"]), identity
    ref, ref_ge, _ = literal(e, y, p, f1, f2, s)
    assert value.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(ge, ref_ge, rtol=1e-10, atol=1e-12)


def test_unknown_function_is_named():
    with pytest.raises(ValueError, match="function"):
        RSWLoss(3, 2, alpha=1.0, k1=0.5, k2=1.5, function="cubic")


def test_float32_under_autocast_and_kaiming_init():
    torch.manual_seed(0)
    loss = RSWLoss(400, 64, alpha=2.0, k1=0.5, k2=1.5)
    assert loss.proxies.std().item() == pytest.approx(math.sqrt(2 / 400), rel=0.03)  # kaiming fan_out
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(torch.randn(8, 64).bfloat16(), torch.randint(0, 400, (8,)))
    assert value.dtype == torch.float32
