"""PFML and CPML against a literal float64 evaluation of eqs. (1)–(6) (docs/readings/pfml.md#pfml-r2)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from dmlrepro.losses import CPMLLoss, PFMLLoss

from brute_force import class_field, cpml_potentials, pfml_potentials, total_energy

ALPHAS = [(0.0, "linear"), (0.0, "literal"), (1.0, "linear"), (4.0, "linear"), (6.0, "linear")]


def make_problem(seed, batch, num_classes, m, dim, proxy_std=0.45):
    g = torch.Generator().manual_seed(seed)
    z = F.normalize(torch.randn(batch, dim, generator=g, dtype=torch.float64), dim=1)
    y = torch.randint(0, num_classes, (batch,), generator=g)
    # near pairs of every kind, so that both regimes of both potentials are exercised
    z[1] = F.normalize(z[0] + 0.15 * torch.randn(dim, generator=g, dtype=torch.float64), dim=0)
    y[1] = y[0]
    z[3] = F.normalize(z[2] + 0.25 * torch.randn(dim, generator=g, dtype=torch.float64), dim=0)
    y[3] = (y[2] + 1) % num_classes
    p = torch.randn(num_classes * m, dim, generator=g, dtype=torch.float64) * proxy_std
    if m:
        p[-1] = z[4] + 0.1 * torch.randn(dim, generator=g, dtype=torch.float64)
    return z, y, p


def build(kind, num_classes, dim, m, p, delta_att, delta_rep, **kw):
    cls = PFMLLoss if kind == "pfml" else CPMLLoss
    loss = cls(num_classes, dim, m, delta=delta_att, delta_rep=delta_rep, **kw).double()
    with torch.no_grad():
        loss.proxies.copy_(p)
    return loss


def reference(kind, z, y, p, num_classes, m, delta_att, delta_rep, alpha=None, alpha0_mode=None, repulsion=None):
    if kind == "pfml":
        att, rep = pfml_potentials(delta_att, delta_rep, alpha, alpha0_mode)
    else:
        att, rep = cpml_potentials(delta_att, delta_rep, repulsion)
    zr, pr = z.clone().requires_grad_(), p.clone().requires_grad_()
    energy = total_energy(zr, y, pr, num_classes, m, att, rep, include_self=False)
    grads = (
        torch.autograd.grad(energy, [zr, pr], allow_unused=True)
        if torch.is_tensor(energy) and energy.requires_grad
        else (None, None)
    )
    with torch.no_grad():
        literal = total_energy(z, y, p, num_classes, m, att, rep, include_self=True)
    return float(literal), att, [torch.zeros_like(t) if g is None else g for g, t in zip(grads, (z, p))]


CASES = list(itertools.product(["dense", "neighbour"], [0, 1, 3], ALPHAS))


@pytest.mark.parametrize("pair_search,m,alpha_mode", CASES)
def test_pfml_equals_literal_equations(pair_search, m, alpha_mode):
    alpha, alpha0_mode = alpha_mode
    num_classes, batch, dim, delta_att, delta_rep = 4, 7, 4, 0.5, 0.8
    z, y, p = make_problem(10 * m + int(alpha) + (alpha0_mode == "literal"), batch, num_classes, m, dim)
    loss = build(
        "pfml",
        num_classes,
        dim,
        m,
        p,
        delta_att,
        delta_rep,
        alpha=alpha,
        alpha0_mode=alpha0_mode,
        pair_search=pair_search,
    )
    zr = z.clone().requires_grad_()
    value = loss(zr, y)
    value.backward()
    literal, att, (gz, gp) = reference("pfml", z, y, p, num_classes, m, delta_att, delta_rep, alpha, alpha0_mode)
    n_points = batch + num_classes * m
    # PFML-R2: literal eq. (6) = PFMLLoss + (B + NM)·ψ_att(0)
    assert value.item() + n_points * float(att(torch.tensor(0.0, dtype=torch.float64))) == pytest.approx(
        literal, rel=1e-12, abs=1e-9
    )
    torch.testing.assert_close(zr.grad, gz, rtol=1e-10, atol=1e-10)
    if m:
        torch.testing.assert_close(loss.proxies.grad, gp, rtol=1e-10, atol=1e-10)
    # the problem really exercises both regimes of both potentials
    d = torch.cdist(torch.cat([z, p]), torch.cat([z, p]))
    assert ((d > 0) & (d < min(delta_att, delta_rep))).any() and (d > max(delta_att, delta_rep)).any()


@pytest.mark.parametrize(
    "pair_search,m,repulsion", list(itertools.product(["dense", "neighbour"], [0, 1, 3], ["mirror", "hinge"]))
)
def test_cpml_equals_literal_equations(pair_search, m, repulsion):
    num_classes, batch, dim, delta_att, delta_rep = 3, 6, 5, 0.6, 0.9
    z, y, p = make_problem(7 + m, batch, num_classes, m, dim)
    loss = build("cpml", num_classes, dim, m, p, delta_att, delta_rep, repulsion=repulsion, pair_search=pair_search)
    zr = z.clone().requires_grad_()
    value = loss(zr, y)
    value.backward()
    literal, att, (gz, gp) = reference("cpml", z, y, p, num_classes, m, delta_att, delta_rep, repulsion=repulsion)
    n_points = batch + num_classes * m
    assert value.item() + n_points * delta_att**2 == pytest.approx(literal, rel=1e-12)
    torch.testing.assert_close(zr.grad, gz, rtol=1e-10, atol=1e-10)
    if m:
        torch.testing.assert_close(loss.proxies.grad, gp, rtol=1e-10, atol=1e-10)


def test_mean_reduction_divides_by_point_count():
    z, y, p = make_problem(3, 6, 3, 2, 4)
    total = build("pfml", 3, 4, 2, p, 0.5, None)(z, y)
    mean = build("pfml", 3, 4, 2, p, 0.5, None, reduction="mean")(z, y)
    assert float(mean) == pytest.approx(float(total) / (6 + 3 * 2), rel=1e-12)


@pytest.mark.parametrize("who", ["sample", "proxy"])
def test_gradient_is_twice_the_field_gradient(who):
    """PFML-R2: ∇U at a point = 2·∇_r Ψ_class(r) with the other sources held fixed (finite differences)."""
    num_classes, m, dim, da, dr, alpha = 3, 2, 4, 0.5, 0.7, 3.0
    z, y, p = make_problem(11, 6, num_classes, m, dim)
    loss = build("pfml", num_classes, dim, m, p, da, dr, alpha=alpha)
    zr = z.clone().requires_grad_()
    loss(zr, y).backward()
    att, rep = pfml_potentials(da, dr, alpha)
    index = 2 if who == "sample" else 3
    point = (z if who == "sample" else p)[index]
    cls = int(y[index]) if who == "sample" else index // m
    skip = ("z", index) if who == "sample" else ("p", index)
    h, numeric = 1e-6, torch.zeros(dim, dtype=torch.float64)
    for k in range(dim):
        step = torch.zeros(dim, dtype=torch.float64)
        step[k] = h
        numeric[k] = (
            class_field(point + step, cls, z, y, p, num_classes, m, att, rep, skip)
            - class_field(point - step, cls, z, y, p, num_classes, m, att, rep, skip)
        ) / (2 * h)
    analytic = zr.grad[index] if who == "sample" else loss.proxies.grad[index]
    assert numeric.abs().max() > 1e-3  # a real force acts here
    torch.testing.assert_close(analytic, 2 * numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("same,distance", [(True, 0.3), (False, 0.9), (False, 0.7)])
def test_zero_force_zones(same, distance):
    """Eqs. (1)-(2): no force between a lone same-class pair inside δ_att, nor a different-class pair at d ≥ δ_rep."""
    loss = PFMLLoss(2, 2, 0, delta=0.5, delta_rep=0.7, alpha=4.0).double()
    z = torch.tensor([[0.0, 0.0], [distance, 0.0]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 0 if same else 1])
    loss(z, y).backward()
    assert torch.equal(z.grad, torch.zeros_like(z))
    # and the opposite regime does feel a force (the test can fail)
    z2 = torch.tensor([[0.0, 0.0], [0.6 if same else 0.4, 0.0]], dtype=torch.float64, requires_grad=True)
    loss(z2, y).backward()
    assert z2.grad.abs().max() > 0


@pytest.mark.parametrize("kind,pair_search", list(itertools.product(["pfml", "cpml"], ["dense", "neighbour"])))
def test_finite_gradients_at_coincident_points(kind, pair_search):
    """PFML-R7: duplicated embeddings and proxies sitting exactly on samples (same and other class)."""
    num_classes, m, dim = 3, 2, 4
    z, y, p = make_problem(5, 6, num_classes, m, dim)
    z = z.float()
    z[1] = z[0]  # duplicate image, same class
    z[3] = z[2]
    y[3] = (y[2] + 1) % num_classes  # coincident embeddings of different classes
    p = p.float()
    p[y[0] * m] = z[0]  # proxy on a same-class sample
    p[((y[4] + 1) % num_classes) * m] = z[4]  # proxy on an other-class sample
    p[1] = p[2]  # proxies of different classes coincide
    loss = (PFMLLoss if kind == "pfml" else CPMLLoss)(num_classes, dim, m, delta=0.5, pair_search=pair_search)
    with torch.no_grad():
        loss.proxies.copy_(p)
    zr = z.clone().requires_grad_()
    value = loss(zr, y)
    value.backward()
    assert torch.isfinite(value)
    assert torch.isfinite(zr.grad).all() and torch.isfinite(loss.proxies.grad).all()


def test_energy_is_float32_under_autocast():
    z, y, p = make_problem(2, 8, 3, 2, 6)
    loss = build("pfml", 3, 6, 2, p, 0.5, None).float()
    reference_value = loss(z.float().bfloat16().float(), y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(z.float().bfloat16(), y)
    assert value.dtype == torch.float32
    assert float(value) == pytest.approx(float(reference_value), rel=1e-6)


def test_no_proxy_ablation_has_only_sample_terms():
    z, y, _ = make_problem(4, 6, 3, 0, 4)
    loss = PFMLLoss(3, 4, 0).double()
    assert loss.proxies.shape == (0, 4)
    att, rep = pfml_potentials(0.2, 0.2, 4.0)
    assert float(loss(z, y)) == pytest.approx(float(total_energy(z, y, loss.proxies, 3, 0, att, rep, False)), rel=1e-12)


def test_proxy_layout_and_init():
    loss = PFMLLoss(5, 8, 3)
    assert loss.proxies.shape == (15, 8)
    assert torch.equal(loss.proxy_labels, torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]))
    unit = PFMLLoss(5, 8, 3, proxy_init="unit_sphere")
    torch.testing.assert_close(unit.proxies.norm(dim=1), torch.ones(15))
    torch.manual_seed(0)
    big = PFMLLoss(50, 512, 20)
    assert big.proxies.std().item() == pytest.approx((2 / 50) ** 0.5, rel=0.02)


def test_normalize_proxies_uses_unit_proxies():
    z, y, p = make_problem(8, 6, 3, 2, 4)
    normed = build("pfml", 3, 4, 2, p, 0.5, None, normalize_proxies=True)(z, y)
    explicit = build("pfml", 3, 4, 2, F.normalize(p, dim=1), 0.5, None)(z, y)
    assert float(normed) == pytest.approx(float(explicit), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"alpha": -1.0}, "alpha"),
        ({"alpha0_mode": "wrong"}, "alpha0_mode"),
        ({"delta": 0.0}, "delta"),
        ({"reduction": "max"}, "reduction"),
        ({"pair_search": "kd"}, "pair_search"),
        ({"proxy_init": "zeros"}, "proxy_init"),
        ({"d_floor": 0.5}, "d_floor"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PFMLLoss(3, 4, 2, **kwargs)
