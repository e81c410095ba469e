"""The proxy–proxy neighbour list stays exact as proxies move (docs/losses.md, exact near-pair evaluation)."""

from __future__ import annotations

import pytest
import torch

from dmlrepro.losses import CPMLLoss, PFMLLoss
from dmlrepro.losses.distances import (
    raised_threshold,
    search_bound,
    search_columns,
    search_rows,
    squared_distance_lower_bounds,
)
from dmlrepro.losses.neighbour_list import NeighbourList


def brute_near_pairs(points, labels, radius):
    d = torch.cdist(points.double(), points.double())
    near = (d < radius) & (labels[:, None] != labels[None, :])
    i, j = torch.nonzero(torch.triu(near, diagonal=1), as_tuple=True)
    return set(zip(i.tolist(), j.tolist()))


def test_list_holds_every_near_pair_while_points_move():
    g = torch.Generator().manual_seed(0)
    n, dim, radius, skin = 300, 5, 0.3, 0.05
    labels = torch.arange(n // 3).repeat_interleave(3)
    points = torch.randn(n, dim, generator=g) * 0.5
    nlist = NeighbourList(radius, skin)
    partial_refreshes = 0
    for step in range(40):
        if step % 13 == 12:  # teleport a few points
            points[torch.randint(0, n, (5,), generator=g)] = torch.randn(5, dim, generator=g) * 0.5
        else:  # most points drift a little, some a lot
            points = points + 0.01 * torch.randn(n, dim, generator=g)
            movers = torch.randint(0, n, (10,), generator=g)
            points[movers] += 0.2 * torch.randn(10, dim, generator=g)
        first, second = nlist.pairs(points, labels)
        held = set(zip(first.tolist(), second.tolist()))
        assert len(held) == first.numel()  # no duplicates
        assert (first < second).all() and (labels[first] != labels[second]).all()
        truth = brute_near_pairs(points, labels, radius)
        assert truth <= held, f"step {step}: {len(truth - held)} near pairs missing"
        partial_refreshes += 0 < nlist.stats["rows_refreshed"] < n
    assert truth, "the test must contain near pairs"
    assert partial_refreshes > 10  # the incremental path, not only full rebuilds, was exercised
    assert nlist.stats["rebuilds"] == 1


def test_skin_zero_refreshes_every_moved_row():
    labels = torch.tensor([0, 0, 1, 1])
    points = torch.tensor([[0.0, 0], [1, 0], [0, 1], [1, 1]])
    nlist = NeighbourList(0.5, 0.0)
    nlist.pairs(points, labels)
    points[2] = torch.tensor([0.1, 0.1])
    first, second = nlist.pairs(points, labels)
    assert nlist.stats["rows_refreshed"] == 1
    assert set(zip(first.tolist(), second.tolist())) == {(0, 2)}


@pytest.mark.parametrize(
    "loss_class,kwargs,pair_chunk",
    [
        (PFMLLoss, {"alpha": 4.0}, None),
        (PFMLLoss, {"alpha": 0.0}, None),
        (CPMLLoss, {"repulsion": "hinge"}, None),
        (PFMLLoss, {"alpha": 4.0}, 7),
    ],
)
def test_neighbour_mode_equals_dense_during_training(monkeypatch, loss_class, kwargs, pair_chunk):
    """Same proxies, one optimiser: value and gradients of both modes agree at every step (fp32).

    With `pair_chunk`, the near proxy pairs are evaluated in checkpointed chunks of that size."""
    if pair_chunk:
        from dmlrepro.losses import potential_field

        monkeypatch.setattr(potential_field, "PAIR_CHUNK", pair_chunk)
    torch.manual_seed(0)
    num_classes, m, dim, delta = 60, 3, 6, 0.35
    dense = loss_class(num_classes, dim, m, delta=delta, pair_search="dense", **kwargs)
    sparse = loss_class(num_classes, dim, m, delta=delta, pair_search="neighbour", skin=0.05, **kwargs)
    with torch.no_grad():
        dense.proxies.mul_(0.0).add_(torch.randn_like(dense.proxies) * 0.3)
        sparse.proxies.copy_(dense.proxies)
    optimiser = torch.optim.Adam(dense.parameters(), lr=0.02)
    rows = []
    for _ in range(25):
        z = torch.nn.functional.normalize(torch.randn(32, dim), dim=1).requires_grad_()
        y = torch.randint(0, num_classes, (32,))
        with torch.no_grad():
            sparse.proxies.copy_(dense.proxies)
        sparse.proxies.grad = None
        optimiser.zero_grad()
        u_dense, u_sparse = dense(z, y), sparse(z, y)
        (gz_dense,) = torch.autograd.grad(u_dense, z, retain_graph=True)
        u_dense.backward()
        (gz_sparse,) = torch.autograd.grad(u_sparse, z, retain_graph=True)
        u_sparse.backward()
        assert u_sparse.item() == pytest.approx(u_dense.item(), rel=2e-6)
        scale = dense.proxies.grad.abs().max()
        torch.testing.assert_close(sparse.proxies.grad, dense.proxies.grad, rtol=1e-4, atol=1e-5 * scale)
        torch.testing.assert_close(gz_sparse, gz_dense, rtol=1e-4, atol=1e-5 * gz_dense.abs().max())
        rows.append(sparse.neighbour_stats()["rows_refreshed"])
        optimiser.step()
    d = torch.cdist(dense.proxies.detach(), dense.proxies.detach())
    assert ((d < delta) & (d > 0)).sum() > 0  # near proxy pairs exist, so the list matters
    assert any(0 < r < num_classes * m for r in rows)  # incremental refreshes happened


def test_far_points_travel_far_but_not_past_a_newcomer():
    """A lone point may move far without a refresh; a point refreshed next to it shrinks that allowance."""
    labels = torch.tensor([0, 1, 1])
    points = torch.tensor([[0.0, 0.0], [10.0, 0.0], [-10.0, 0.0]])
    nlist = NeighbourList(radius=0.5, skin=0.05, search_dtype=torch.float32)  # tight bound: exact geometry
    nlist.pairs(points, labels)
    points[0] = torch.tensor([3.0, 0.0])  # far from everything: no refresh needed
    nlist.pairs(points, labels)
    assert nlist.stats["rows_refreshed"] == 0
    points[0] = torch.tensor([0.0, 0.0])
    points[2] = torch.tensor([0.9, 0.0])  # newcomer outside radius + 2·skin (+ rounding bound) of point 0
    first, _ = nlist.pairs(points, labels)
    assert nlist.stats["rows_refreshed"] == 1 and first.numel() == 0
    points[0] = torch.tensor([0.5, 0.0])  # now 0.4 < radius from the newcomer
    first, second = nlist.pairs(points, labels)
    assert set(zip(first.tolist(), second.tolist())) == {(0, 2)}


def test_a_point_searched_next_to_one_still_within_its_allowance():
    """Point 1 jumps past its allowance and is searched against point 0's reference, 2.9 from where point 0
    now is (within point 0's own allowance of 3): the pair, 0.6 apart, is within the radius."""
    labels = torch.tensor([0, 1])
    nlist = NeighbourList(radius=1.0, skin=0.1, search_dtype=torch.float32)
    nlist.pairs(torch.tensor([[0.0, 0.0], [7.0, 0.0]]), labels)
    first, second = nlist.pairs(torch.tensor([[2.9, 0.0], [3.5, 0.0]]), labels)
    assert set(zip(first.tolist(), second.tolist())) == {(0, 1)}
    assert nlist.stats["rows_refreshed"] == 2  # point 1, then point 0 whose gap point 1's search lowered


def test_jumps_next_to_points_that_use_their_allowance():
    """Far-apart points (large allowances) drift up to their allowance while others jump next to them."""
    g = torch.Generator().manual_seed(1)
    n, dim, radius = 120, 3, 0.5
    labels = torch.arange(n // 2).repeat_interleave(2)
    points = torch.rand(n, dim, generator=g) * 40
    nlist = NeighbourList(radius, skin=0.05, search_dtype=torch.float32)
    nlist.pairs(points, labels)
    for step in range(30):
        allowance = ((nlist.gap - radius) / 2).clamp_min(0).clamp_max(5.0)[:, None]
        direction = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
        points = nlist.reference + 0.95 * allowance * direction  # each within its allowance
        jumpers = torch.randint(0, n, (6,), generator=g)
        targets = torch.randint(0, n, (6,), generator=g)
        points[jumpers] = points[targets] + 0.3 * torch.randn(6, dim, generator=g)
        first, second = nlist.pairs(points, labels)
        truth = brute_near_pairs(points, labels, radius)
        assert truth <= set(zip(first.tolist(), second.tolist())), f"step {step}: near pairs missing"


@pytest.mark.parametrize(
    "dtype,roundoff", [(torch.bfloat16, 2.0**-8), (torch.float32, 2.0**-24), (torch.float32, 2.0**-11)]
)
@pytest.mark.parametrize("scale", [0.05, 1.0, 6.0])
def test_search_gives_lower_bounds_within_each_pairs_bound(scale, dtype, roundoff):
    """Against float64 distances the GEMM's results are lower bounds, each within twice its own pair's bound
    (from the pair's two norms, rows of norms spread over 20x), and the bound is not vacuous.

    roundoff 2^-11 is a float32 GEMM whose inputs are rounded to TF32 (CUDA with TF32 allowed),
    emulated here by rounding the inputs to 10 explicit mantissa bits before the float32 GEMM."""
    g = torch.Generator().manual_seed(1)
    spread = torch.logspace(-1, 0.3, 300)[:, None]  # row norms from 0.1 to 2 times the scale
    a, b = torch.randn(300, 512, generator=g) * spread * scale / 22, torch.randn(500, 512, generator=g) * scale / 22
    b[:50] = a[:50] + 1e-3 * torch.randn(50, 512, generator=g)  # near pairs, where cancellation is worst
    bound = search_bound(512, dtype, roundoff)
    rows, columns = search_rows(a, bound), search_columns(b, bound)
    if roundoff == 2.0**-11:
        rows, columns = round_to_tf32(rows), round_to_tf32(columns)
    lower = squared_distance_lower_bounds(rows, columns).double()
    exact = torch.cdist(a.double(), b.double()).pow(2)
    na, nb = a.double().norm(dim=1)[:, None], b.double().norm(dim=1)[None, :]
    own = bound.k_sq * (na**2 + nb**2) + bound.k_x * na * nb  # each pair's bound
    v = bound.output_roundoff  # the result is stored in `dtype`: relative rounding
    assert (torch.where(lower > 0, lower / (1 + v), lower) <= exact).all()
    assert (lower >= exact - 2 * own - v * (exact + 2 * own) - 1e-12).all()
    assert (bound.distance_lower_bound(lower.to(dtype)).double() ** 2 <= exact * (1 + 1e-6)).all()
    error = ((exact - lower) - own).abs() / own  # the GEMM's own error, relative to the pair's bound
    if roundoff > 2.0**-24:  # input rounding dominates: the bound is within 50x of the worst error seen
        assert error.max() > 1 / 50
    else:  # float32: the worst-case accumulation term dominates, yet it widens the search negligibly
        assert (own < 1e-3 * (na + nb) ** 2).all()
    for t in (0.3, 1.7, 123.4, 1e-3 + 1e-9):
        assert torch.tensor(raised_threshold(t, dtype), dtype=dtype).double() >= t
        assert torch.tensor(bound.threshold(t), dtype=dtype).double() >= t * (1 + bound.output_roundoff)


def round_to_tf32(x):
    """float32 rounded to nearest with 10 explicit mantissa bits (what TF32 tensor cores read)."""
    bits = x.view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("sparse_block", ["DENSE_PROXY_PAIRS", "DENSE_SAMPLE_PROXY_PAIRS"])
def test_auto_mode_mixing_dense_and_near_blocks_is_exact(monkeypatch, sparse_block):
    from dmlrepro.losses import potential_field

    monkeypatch.setattr(potential_field, sparse_block, 0)  # this block evaluated from near pairs only
    torch.manual_seed(3)
    z = torch.nn.functional.normalize(torch.randn(16, 5, dtype=torch.float64), dim=1)
    y = torch.randint(0, 20, (16,))
    values, grads = [], []
    for mode in ("auto", "dense"):
        torch.manual_seed(4)
        loss = PFMLLoss(20, 5, 3, delta=0.6, pair_search=mode).double()
        with torch.no_grad():
            loss.proxies.mul_(3.0)
        zr = z.clone().requires_grad_()
        value = loss(zr, y)
        value.backward()
        values.append(value.item())
        grads.append((zr.grad, loss.proxies.grad))
    assert values[0] == pytest.approx(values[1], rel=1e-12)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_result_does_not_depend_on_the_lists_history():
    """A rebuilt list (as after a resume) gives bit-identical energy and gradients."""
    torch.manual_seed(5)
    loss = PFMLLoss(40, 6, 3, delta=0.5, pair_search="neighbour")
    z = torch.nn.functional.normalize(torch.randn(16, 6), dim=1)
    y = torch.randint(0, 40, (16,))
    optimiser = torch.optim.Adam(loss.parameters(), lr=0.05)
    for _ in range(5):  # give the list a history of partial refreshes
        optimiser.zero_grad()
        loss(z, y).backward()
        optimiser.step()
    loss.proxies.grad = None
    warm = loss(z, y)
    warm.backward()
    warm_grad = loss.proxies.grad.clone()
    fresh = PFMLLoss(40, 6, 3, delta=0.5, pair_search="neighbour")
    fresh.load_state_dict(loss.state_dict())
    cold = fresh(z, y)
    cold.backward()
    assert loss.neighbour_stats()["rebuilds"] == 1 and fresh.neighbour_stats()["rebuilds"] == 1
    assert warm.item() == cold.item()
    assert torch.equal(warm_grad, fresh.proxies.grad)


@pytest.mark.parametrize("loss_class,kwargs", [(PFMLLoss, {"alpha": 4.0}), (CPMLLoss, {"repulsion": "hinge"})])
def test_partial_refreshes_equal_a_full_rebuild_at_every_step(loss_class, kwargs):
    """The list refreshed row by row gives bit-identical energy and gradients to a list searched afresh at each step."""
    torch.manual_seed(3)
    num_classes, m, dim, delta = 50, 2, 5, 0.4
    kept = loss_class(num_classes, dim, m, delta=delta, pair_search="neighbour", skin=0.04, **kwargs)
    rebuilt = loss_class(num_classes, dim, m, delta=delta, pair_search="neighbour", skin=0.04, **kwargs)
    rebuilt.load_state_dict(kept.state_dict())
    optimiser = torch.optim.Adam(kept.parameters(), lr=0.03)
    partial = 0
    for step in range(30):
        z = torch.nn.functional.normalize(torch.randn(24, dim), dim=1)
        y = torch.randint(0, num_classes, (24,))
        with torch.no_grad():
            rebuilt.proxies.copy_(kept.proxies)
        rebuilt._neighbours.reset()  # searched afresh: every row against every column
        results = []
        for loss in (kept, rebuilt):
            loss.proxies.grad = None
            zr = z.clone().requires_grad_()
            value = loss(zr, y)
            value.backward()
            results.append((value, zr.grad, loss.proxies.grad))
        assert rebuilt.neighbour_stats()["rows_refreshed"] == num_classes * m
        assert results[0][0].item() == results[1][0].item(), f"step {step}"
        assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][2], results[1][2]), f"step {step}"
        partial += 0 < kept.neighbour_stats()["rows_refreshed"] < num_classes * m
        optimiser.step()
    assert kept.neighbour_stats()["rebuilds"] == 1 and partial >= 10  # the row-by-row path was exercised
    assert kept.neighbour_stats()["pairs"] > 0  # near pairs exist, so a missing one would change the energy
