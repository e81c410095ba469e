"""PFML's two ways through the different-class pairs: the dense matrices and the near pairs of a neighbour
list agree on one batch, whatever the search precision, and the dense distances do not depend on TF32."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dmlrepro.losses import PFMLLoss
from dmlrepro.losses.distances import search_bound
from dmlrepro.losses.neighbour_list import NeighbourList
from dmlrepro.losses.search_precision import input_roundoff

DIM, DELTA = 512, 0.2  # PFML's embedding size and δ (supp. Table 5); the list's reach is δ + 2·δ/10


def clustered_unit_proxies(num_classes=192, clusters=48, seed=0):
    """Proxies of norm ~1 in 512-d, in clusters where different-class pairs lie 0.2–0.45 apart (around the
    list's reach, 0.24), and one proxy of norm 1.5: a search bounded by the largest norm of all rows would
    hold the pairs up to ~0.44 apart."""
    g = torch.Generator().manual_seed(seed)
    n = num_classes * 2
    centres = torch.nn.functional.normalize(torch.randn(clusters, DIM, generator=g, dtype=torch.float64), dim=1)
    offsets = torch.nn.functional.normalize(torch.randn(n, DIM, generator=g, dtype=torch.float64), dim=1)
    radii = 0.14 + 0.18 * torch.rand(n, 1, generator=g, dtype=torch.float64)
    # class j's two proxies (rows 2j, 2j + 1) sit in different clusters
    cluster_of = torch.cat([torch.arange(n // 2) % clusters, (torch.arange(n // 2) + 1) % clusters])
    cluster_of = cluster_of.view(2, -1).T.flatten()
    points = centres[cluster_of] + radii * offsets
    points[-1] = 1.5 * torch.nn.functional.normalize(torch.randn(DIM, generator=g, dtype=torch.float64), dim=0)
    return points.float(), torch.arange(num_classes).repeat_interleave(2)


def test_bfloat16_search_holds_only_pairs_within_its_own_bound():
    """Forced to bfloat16 (emulated where the CPU has no bfloat16 units), the list holds no more than the
    float32 list's pairs plus the pairs that each pair's own bound (from its two norms) lets in."""
    points, labels = clustered_unit_proxies()
    reach2 = (DELTA + 2 * DELTA / 10) ** 2
    held = {}
    for dtype in (torch.float32, torch.bfloat16):
        first, second = NeighbourList(DELTA, DELTA / 10, search_dtype=dtype).pairs(points, labels)
        held[dtype] = set(zip(first.tolist(), second.tolist()))
    x = points.double()
    d2 = torch.cdist(x, x).square()
    norms = x.norm(dim=1)
    bound = search_bound(DIM, torch.bfloat16, input_roundoff(torch.bfloat16, points.device))
    own = bound.k_sq * (norms[:, None] ** 2 + norms[None, :] ** 2) + bound.k_x * norms[:, None] * norms[None, :]
    widened = d2 < (reach2 + 2 * own) * (1 + 4 * bound.output_roundoff)  # lower bound within 2·own, then stored
    allowed = held[torch.float32] | {(i, j) for i, j in held[torch.bfloat16] if widened[i, j]}
    far = held[torch.bfloat16] - allowed
    assert not far, f"{len(far)} pairs held beyond the bound, e.g. {sorted(far)[:3]} at {d2[sorted(far)[0]].sqrt():.3f}"
    truth = {
        (i, j) for i, j in zip(*torch.nonzero(torch.triu(d2 < reach2, 1), as_tuple=True)) if labels[i] != labels[j]
    }
    assert truth and {(int(i), int(j)) for i, j in truth} <= held[torch.bfloat16] & held[torch.float32]
    # the clusters hold pairs a bound from the largest norm (1.5) would keep and the pairs' own (~1) do not
    unit = slice(0, -1)  # all but the proxy of norm 1.5
    between = (d2[unit, unit] > (reach2 + 2 * own[unit, unit].max()) * 1.01) & (d2[unit, unit] < 0.43**2)
    assert (between & (labels[unit, None] != labels[None, unit])).any()


def paths_on_one_batch(search_dtype, steps=4):
    """The dense and the neighbour-list PFML, same proxies, same batches: losses and gradients per step."""
    points, _ = clustered_unit_proxies()
    losses = {
        mode: PFMLLoss(len(points) // 2, DIM, 2, delta=DELTA, pair_search=mode, search_dtype=search_dtype)
        for mode in ("dense", "neighbour")
    }
    for loss in losses.values():
        with torch.no_grad():
            loss.proxies.copy_(points)
    optimiser = torch.optim.Adam(losses["dense"].parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    results = []
    for _ in range(steps):
        y = torch.randint(0, len(points) // 2, (64,), generator=g)
        z = losses["dense"].proxies.detach()[2 * y] + 0.1 * torch.randn(64, DIM, generator=g) / DIM**0.5
        step = {}
        for mode, loss in losses.items():
            with torch.no_grad():
                loss.proxies.copy_(losses["dense"].proxies)
            loss.proxies.grad = None
            zr = z.clone().requires_grad_()
            value = loss(zr, y)
            value.backward()
            step[mode] = (value.detach(), zr.grad, loss.proxies.grad.clone())
        results.append(step)
        optimiser.step()
    return losses, results


@pytest.mark.parametrize("search_dtype", [None, torch.bfloat16])
def test_dense_and_neighbour_list_paths_agree(search_dtype):
    """Measured in float32 on this project's CPU (AMD EPYC, AVX-512 with bfloat16 units): the two paths' energies
    differ by at most 6.4e-8 relatively, their gradients by at most 1.43e-6 (embeddings) and 7.8e-7 (proxies)
    of the largest: the dense path's expanded ‖a‖² + ‖b‖² − 2a·b loses ~ε·(‖a‖² + ‖b‖²)/d² ≈ 3e-6 of d² near
    δ against the list's differences. The tolerances are ~7-15x that."""
    losses, results = paths_on_one_batch(search_dtype)
    assert losses["neighbour"].neighbour_stats()["pairs"] > 0  # near proxy pairs exist: the list matters
    for step in results:
        (u_dense, gz_dense, gp_dense), (u_list, gz_list, gp_list) = step["dense"], step["neighbour"]
        assert u_list.item() == pytest.approx(u_dense.item(), rel=1e-6)
        torch.testing.assert_close(gz_list, gz_dense, rtol=0, atol=1e-5 * gz_dense.abs().max())
        torch.testing.assert_close(gp_list, gp_dense, rtol=0, atol=1e-5 * gp_dense.abs().max())
    assert (losses["dense"].pair_search_path, losses["neighbour"].pair_search_path) == ("dense", "neighbour_list")


def test_search_precision_changes_no_bit():
    _, float32 = paths_on_one_batch(torch.float32, steps=2)
    _, bfloat16 = paths_on_one_batch(torch.bfloat16, steps=2)
    for a, b in zip(float32, bfloat16):
        assert all(torch.equal(x, y) for x, y in zip(a["neighbour"], b["neighbour"]))


def test_pair_search_path_records_every_call(monkeypatch):
    from dmlrepro.losses import potential_field

    loss = PFMLLoss(10, 8, 2, pair_search="auto")
    assert loss.pair_search_path is None
    z, y = torch.nn.functional.normalize(torch.randn(6, 8), dim=1), torch.randint(0, 10, (6,))
    loss(z, y)
    assert loss.pair_search_path == "dense"  # small blocks: "auto" is dense on the CPU
    monkeypatch.setattr(potential_field, "DENSE_PROXY_PAIRS", 0)  # the proxy–proxy block from its near pairs
    loss(z, y)
    assert loss.pair_search_path == "mixed"


class MatmulFlags(TorchDispatchMode):
    """Records, for every matrix product dispatched, torch's TF32 flag and float32 matmul precision as it ran."""

    PRODUCTS = {"mm", "bmm", "addmm", "baddbmm"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.PRODUCTS:
            self.seen.append((torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("proxies_per_class", [2, 5])  # 5: the same-class block from per-class Gram matrices
@pytest.mark.parametrize("lowered_by", ["allow_tf32", "matmul_precision"])
def test_dense_distances_run_without_tf32_even_when_the_run_allows_it(proxies_per_class, lowered_by):
    """With TF32 allowed for the run (`speed.tf32` sets `allow_tf32`; a caller may lower the float32 matmul
    precision instead), every matrix product of the dense path, forward and backward, runs in IEEE float32
    (observed through torch's flags on the CPU), and the setting is restored."""
    loss = PFMLLoss(12, 16, proxies_per_class, pair_search="dense")
    z = torch.nn.functional.normalize(torch.randn(8, 16), dim=1).requires_grad_()
    y = torch.randint(0, 12, (8,))
    before = torch.get_float32_matmul_precision()
    if lowered_by == "allow_tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_float32_matmul_precision("medium")
    lowered = torch.get_float32_matmul_precision()
    try:
        with MatmulFlags() as flags:
            loss(z, y).backward()
        assert torch.get_float32_matmul_precision() == lowered
    finally:
        torch.set_float32_matmul_precision(before)
    assert len(flags.seen) >= 3 * 3  # three distance blocks, each a product forward and two backward
    assert set(flags.seen) == {(False, "highest")}


def test_float32_product_gradients_are_a_products():
    """The TF32-free product's backward (itself TF32-free products) against finite differences, twice."""
    from dmlrepro.losses.distances import float32_product

    a = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(float32_product, (a, b))
    assert torch.autograd.gradgradcheck(float32_product, (a, b))


def test_the_paths_taken_travel_with_a_checkpoint():
    """A run resumed after a kill records the pair_search_path of an uninterrupted one (the loss's state
    carries it); a checkpoint written before the record (proxies only) still loads."""
    torch.manual_seed(0)
    trained = PFMLLoss(4, 8, 2, 0.2, 4.0)
    trained(torch.randn(8, 8), torch.arange(4).repeat(2))
    resumed = PFMLLoss(4, 8, 2, 0.2, 4.0)
    resumed.load_state_dict(trained.state_dict())
    assert resumed.pair_search_path == trained.pair_search_path == "dense"
    old = PFMLLoss(4, 8, 2, 0.2, 4.0)
    old.load_state_dict({"proxies": trained.proxies.detach()})
    assert old.pair_search_path is None
