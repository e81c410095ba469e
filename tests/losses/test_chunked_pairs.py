"""The chunked all-pairs pass of the proxy–proxy energy (PFML eq. 6) and the choice between it, the full
matrix and the neighbour list: value and gradients against a literal float64 evaluation of eqs. (1)–(6)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from dmlrepro.losses import CPMLLoss, PFMLLoss, potential_field
from dmlrepro.losses.neighbour_list import NeighbourList

from brute_force import cpml_potentials, pfml_potentials, total_energy


def problem(seed, num_classes, m, batch, dim, proxy_std):
    g = torch.Generator().manual_seed(seed)
    z = F.normalize(torch.randn(batch, dim, generator=g, dtype=torch.float64), dim=1)
    y = torch.randint(0, num_classes, (batch,), generator=g)
    p = torch.randn(num_classes * m, dim, generator=g, dtype=torch.float64) * proxy_std
    return z, y, p


def literal(z, y, p, num_classes, m, att, rep):
    """Energy and gradients of the literal eq. (6) without its constant self terms, in float64."""
    zr, pr = z.clone().requires_grad_(), p.clone().requires_grad_()
    energy = total_energy(zr, y, pr, num_classes, m, att, rep, include_self=False)
    gz, gp = torch.autograd.grad(energy, [zr, pr])
    return float(energy), gz, gp


def force_chunks(monkeypatch, rows, n):
    """Row chunks of `rows` rows over n points, and a budget too small for the full matrix or any list."""
    monkeypatch.setattr(potential_field, "CHUNK_BYTES_PER_PAIR", 1)
    monkeypatch.setattr(potential_field, "PAIR_MEMORY_BYTES", rows * n)
    assert n * n * potential_field.DENSE_BYTES_PER_PAIR > rows * n


KINDS = [
    ("pfml", {"alpha": 4.0}),
    ("pfml", {"alpha": 1.0}),
    ("pfml", {"alpha": 0.0, "alpha0_mode": "linear"}),
    ("cpml", {"repulsion": "mirror"}),
    ("cpml", {"repulsion": "hinge"}),
]


@pytest.mark.parametrize(
    "kind,pair_search,rows", list(itertools.product(range(len(KINDS)), ["dense", "neighbour"], [1, 5]))
)
def test_chunked_pass_equals_literal_equations(monkeypatch, kind, pair_search, rows):
    name, kwargs = KINDS[kind]
    num_classes, m, batch, dim, delta_att, delta_rep = 4, 3, 7, 4, 0.5, 0.8
    z, y, p = problem(kind, num_classes, m, batch, dim, proxy_std=0.3)  # many proxy pairs within δ_rep
    force_chunks(monkeypatch, rows, num_classes * m)
    cls = PFMLLoss if name == "pfml" else CPMLLoss
    loss = cls(num_classes, dim, m, delta=delta_att, delta_rep=delta_rep, pair_search=pair_search, **kwargs).double()
    with torch.no_grad():
        loss.proxies.copy_(p)
    zr = z.clone().requires_grad_()
    value = loss(zr, y)
    value.backward()
    assert loss.pair_path == "chunked"
    if name == "pfml":
        att, rep = pfml_potentials(delta_att, delta_rep, kwargs["alpha"], kwargs.get("alpha0_mode", "linear"))
    else:
        att, rep = cpml_potentials(delta_att, delta_rep, kwargs["repulsion"])
    energy, gz, gp = literal(z, y, p, num_classes, m, att, rep)
    assert value.item() == pytest.approx(energy, rel=1e-12, abs=1e-9)
    torch.testing.assert_close(zr.grad, gz, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(loss.proxies.grad, gp, rtol=1e-10, atol=1e-10)
    d = torch.cdist(p, p)
    different = (torch.arange(len(p))[:, None] // m) != (torch.arange(len(p))[None, :] // m)
    assert (different & (d < delta_rep)).any() and (different & (d > delta_rep)).any()  # both regimes of ψ_rep
    with torch.no_grad():  # the no-grad branch (evaluation) sums the same pairs
        assert loss(z, y).item() == pytest.approx(energy, rel=1e-12, abs=1e-9)


def test_chunked_pass_equals_neighbour_list_over_training(monkeypatch):
    """fp32 training: a chunked twin and a neighbour-list twin agree at every step (the existing path)."""
    torch.manual_seed(0)
    num_classes, m, dim, delta = 60, 3, 6, 0.35
    listed = PFMLLoss(num_classes, dim, m, delta=delta, pair_search="neighbour", skin=0.05)
    chunked = PFMLLoss(num_classes, dim, m, delta=delta, pair_search="neighbour", skin=0.05)
    with torch.no_grad():
        listed.proxies.copy_(torch.randn_like(listed.proxies) * 0.3)
    optimiser = torch.optim.Adam(listed.parameters(), lr=0.02)
    for _ in range(8):
        z = F.normalize(torch.randn(32, dim), dim=1).requires_grad_()
        y = torch.randint(0, num_classes, (32,))
        with torch.no_grad():
            chunked.proxies.copy_(listed.proxies)
        chunked.proxies.grad = None
        optimiser.zero_grad()
        u_listed = listed(z, y)
        (gz_listed,) = torch.autograd.grad(u_listed, z, retain_graph=True)
        u_listed.backward()
        with monkeypatch.context() as patch:
            force_chunks(patch, 16, num_classes * m)
            u_chunked = chunked(z, y)
        (gz_chunked,) = torch.autograd.grad(u_chunked, z, retain_graph=True)
        u_chunked.backward()
        assert (listed.pair_path, chunked.pair_path) == ("neighbour", "chunked")
        assert u_chunked.item() == pytest.approx(u_listed.item(), rel=2e-6)
        scale = listed.proxies.grad.abs().max()
        torch.testing.assert_close(chunked.proxies.grad, listed.proxies.grad, rtol=1e-4, atol=1e-5 * scale)
        torch.testing.assert_close(gz_chunked, gz_listed, rtol=1e-4, atol=1e-5 * gz_listed.abs().max())
        optimiser.step()


def near_pairs(p, m, radius):
    labels = torch.arange(len(p)) // m
    d = torch.cdist(p, p)
    return int(((d < radius) & (labels[:, None] != labels[None, :])).sum()) // 2


def test_path_selection(monkeypatch):
    """Full matrix while it fits the budget; the list while its near pairs fit; else the chunked pass,
    and back to the list once they fit again, with the result a fresh start would give."""
    num_classes, m, dim, delta = 30, 2, 8, 0.3
    n = num_classes * m
    z, y, _ = problem(1, num_classes, m, 12, dim, 0.1)
    crowded = torch.randn(n, dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.03
    spread = crowded * 40.0
    spread[3], spread[7] = spread[0] + 0.05, spread[4] - 0.1  # two near pairs of different classes
    assert near_pairs(crowded, m, delta) == n * (n - m) // 2 and 0 < near_pairs(spread, m, delta) < 20
    monkeypatch.setattr(potential_field, "LISTED_PAIR_BYTES", 1)
    monkeypatch.setattr(potential_field, "PAIR_MEMORY_BYTES", 100)  # room for 100 listed pairs, chunks of 1 row

    def run(loss, proxies):
        with torch.no_grad():
            loss.proxies.copy_(proxies)
        loss.proxies.grad = None
        value = loss(z, y)
        value.backward()
        return value.item(), loss.proxies.grad.clone(), loss.pair_path

    warm = PFMLLoss(num_classes, dim, m, delta=delta, pair_search="neighbour").double()
    assert run(warm, spread)[2] == "neighbour"
    assert run(warm, crowded)[2] == "chunked"  # the list gave up: 1,740 near pairs
    assert run(warm, crowded)[2] == "chunked" and not warm._listed_pairs_fit  # not searched again while crowded
    value, grad, path = run(warm, spread)
    fresh = PFMLLoss(num_classes, dim, m, delta=delta, pair_search="neighbour").double()
    fresh_value, fresh_grad, fresh_path = run(fresh, spread)
    assert path == fresh_path == "neighbour" and value == fresh_value and torch.equal(grad, fresh_grad)  # bit-identical
    assert run(PFMLLoss(num_classes, dim, m, delta=delta, pair_search="dense").double(), spread)[2] == "chunked"
    monkeypatch.setattr(potential_field, "PAIR_MEMORY_BYTES", n * n * potential_field.DENSE_BYTES_PER_PAIR)
    assert run(PFMLLoss(num_classes, dim, m, delta=delta, pair_search="dense").double(), spread)[2] == "dense"


def test_neighbour_list_gives_up_beyond_max_pairs():
    labels = torch.arange(40).repeat_interleave(2)
    points = torch.randn(80, 3, generator=torch.Generator().manual_seed(3)) * 0.05  # every pair near
    nlist = NeighbourList(0.5, 0.05)
    assert nlist.pairs(points, labels, max_pairs=1000) is None and nlist.reference is None
    first, _ = nlist.pairs(points, labels, max_pairs=80 * 78)  # each candidate found from both rows
    assert first.numel() == 80 * 78 // 2
