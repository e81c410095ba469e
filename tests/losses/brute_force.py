"""Independent float64 references written literally from the papers' equations (no vectorisation)."""

from __future__ import annotations

import math

import torch


def pfml_potentials(delta_att, delta_rep, alpha, alpha0_mode="linear"):
    """ψ_att, ψ_rep of PFML eqs. (1)–(2) as functions of a scalar distance (torch 0-d tensors)."""

    def att(d):
        if alpha > 0:
            return -(1.0 / delta_att**alpha) if d < delta_att else -(1.0 / d**alpha)
        if alpha0_mode == "linear":
            return delta_att if d < delta_att else d
        return -1.0

    def rep(d):
        if alpha > 0:
            return 1.0 / d**alpha if d < delta_rep else 1.0 / delta_rep**alpha
        if alpha0_mode == "linear":
            return -d if d < delta_rep else -delta_rep
        return 1.0

    return att, rep


def cpml_potentials(delta_att, delta_rep, repulsion="mirror"):
    """ψ*_att (supp. eq. 2) and the two readings of ψ*_rep (docs/readings/pfml.md#pfml-r8)."""

    def att(d):
        return delta_att**2 if d < delta_att else d**2

    def rep(d):
        if repulsion == "mirror":
            return -(d**2) if d < delta_rep else -(delta_rep**2)
        return (delta_rep - d) ** 2 if d < delta_rep else 0.0 * d

    return att, rep


def _dist(a, b):
    return torch.sqrt(((a - b) ** 2).sum())


def class_field(r, j, z, y, p, num_classes, m, att, rep, skip=None):
    """Ψ_j(r) of eqs. (3)–(5): a literal sum over batch samples and all proxies.

    `skip` = ("z", i) or ("p", row) leaves out the source at r itself (its constant self term)."""
    total = 0.0
    for i in range(len(z)):
        if skip == ("z", i):
            continue
        d = _dist(r, z[i])
        total = total + (att(d) if int(y[i]) == j else rep(d))
    for gamma in range(num_classes):
        for k in range(m):
            row = gamma * m + k
            if skip == ("p", row):
                continue
            d = _dist(r, p[row])
            total = total + (att(d) if gamma == j else rep(d))
    return total


def total_energy(z, y, p, num_classes, m, att, rep, include_self=True):
    """𝒰 of eq. (6): Σ_i Ψ_{y_i}(z_i) + Σ_j Σ_k Ψ_j(p_{j,k}).

    With include_self, the self terms ψ_att(0) that eqs. (4)/(6) literally contain are added as
    constants (they have no gradient); without it they are left out, as PFMLLoss does."""
    energy = 0.0
    for i in range(len(z)):
        energy = energy + class_field(z[i], int(y[i]), z, y, p, num_classes, m, att, rep, skip=("z", i))
    for j in range(num_classes):
        for k in range(m):
            row = j * m + k
            energy = energy + class_field(p[row], j, z, y, p, num_classes, m, att, rep, skip=("p", row))
    if include_self:
        energy = energy + (len(z) + num_classes * m) * float(att(torch.tensor(0.0, dtype=torch.float64)))
    return energy


def rsw_sample_loss(e, y, proxies, f1, f2, s):
    """Eq. 8 for one sample: log(1 + Σ_{j≠y} exp(s·[f1(t_y) − f2(t_j)]))."""
    t = [_dist(e, proxies[j]) for j in range(len(proxies))]
    inner = sum(torch.exp(s * (f1(t[y]) - f2(t[j]))) for j in range(len(proxies)) if j != y)
    return torch.log(1.0 + inner)


def isclose_all(a, b, rtol, atol=0.0):
    return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=atol)
