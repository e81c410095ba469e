"""The near-pair searches' precision per device, and that neither it nor the every-row search changes a pair."""

from __future__ import annotations

import pytest
import torch

from dmlrepro.losses import PFMLLoss, search_precision as sp
from dmlrepro.losses.distances import search_bound
from dmlrepro.losses.neighbour_list import NeighbourList

from test_neighbour_list import brute_near_pairs


@pytest.mark.parametrize(
    "device_type,speedup,expected",
    [
        ("cpu", 3.0, torch.bfloat16),
        ("cpu", sp.BFLOAT16_SPEEDUP * 0.99, torch.float32),
        ("cpu", 0.3, torch.float32),  # bfloat16 emulated: several times slower
        ("cuda", None, torch.float32),
        ("cuda", 3.0, torch.float32),
        ("mps", 3.0, torch.float32),
    ],
)
def test_bfloat16_only_on_cpus_where_it_was_measured_faster(device_type, speedup, expected):
    assert sp.search_dtype_for(device_type, speedup) == expected


def test_cpu_speedup_is_measured_once_per_process(monkeypatch):
    """The choice is the measurement's, not the instruction-set flags': it runs once, then is cached."""
    sp.cpu_bfloat16_speedup.cache_clear()
    calls = []
    real = torch.Tensor.to

    def counting(self, *args, **kwargs):
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting)
    first = sp.cpu_bfloat16_speedup()
    measured = len(calls)
    assert first > 0 and measured > 0
    assert sp.search_dtype_on(torch.device("cpu")) == sp.search_dtype_for("cpu", first)
    assert sp.cpu_bfloat16_speedup() == first and len(calls) == measured  # cached: nothing runs again
    assert sp.search_dtype_on(torch.device("cuda")) == torch.float32


@pytest.mark.parametrize(
    "settings,roundoff",
    [
        (["highest", "ieee", "none"], 2.0**-24),
        (["highest", "tf32", "none"], 2.0**-11),
        (["high", "ieee", "none"], 2.0**-11),
        (["medium", "tf32"], 2.0**-8),
        (["highest", "bf16"], 2.0**-8),
    ],
)
def test_float32_search_accounts_for_reduced_matmul_precision(settings, roundoff):
    """TF32 keeps 10 explicit mantissa bits (u = 2^-11), bfloat16 7 (u = 2^-8), float32 23 (u = 2^-24)."""
    assert sp.float32_matmul_roundoff(settings) == roundoff


def test_tf32_setting_widens_the_float32_bound_on_cuda():
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert sp.input_roundoff(torch.float32, torch.device("cuda")) == 2.0**-11
        assert sp.input_roundoff(torch.bfloat16, torch.device("cuda")) == 2.0**-8
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    if not before and torch.get_float32_matmul_precision() == "highest":
        assert sp.input_roundoff(torch.float32, torch.device("cuda")) == 2.0**-24


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_row_search_finds_every_near_pair_once(dtype):
    """All points move farther than their allowance each step: every row is searched, each pair once,
    in chunks that split classes (chunk_rows=7, 3 points per class)."""
    g = torch.Generator().manual_seed(2)
    n, dim, radius = 150, 4, 0.35
    labels = torch.arange(n // 3).repeat_interleave(3)
    points = torch.randn(n, dim, generator=g) * 0.5
    nlist = NeighbourList(radius, 0.02, chunk_rows=7, search_dtype=dtype)
    for _ in range(6):
        points = points + 0.3 * torch.randn(n, dim, generator=g)
        first, second = nlist.pairs(points, labels)
        assert nlist.stats["rows_refreshed"] == n
        held = list(zip(first.tolist(), second.tolist()))
        assert len(held) == len(set(held)) and (first < second).all() and (labels[first] != labels[second]).all()
        truth = brute_near_pairs(points, labels, radius)
        assert truth and truth <= set(held)
        # the gaps bound every pair left out from below
        d = torch.cdist(points.double(), points.double())
        out = labels[:, None] != labels[None, :]
        out[first, second] = out[second, first] = False
        nearest_left_out = d.masked_fill(~out, float("inf")).amin(1)
        assert (nlist.gap.double() <= nearest_left_out).all()
        # and tightly: each result is within twice its pair's bound of the truth, the gap a rounding below it
        bound = search_bound(dim, dtype, sp.input_roundoff(dtype, points.device))
        max_norm = float(points.norm(dim=1).max())
        own = (2 * bound.k_sq + bound.k_x) * max_norm**2
        floor = (nearest_left_out.square() - 2 * own) * (1 - 2 * bound.output_roundoff) - 1e-6
        assert (nlist.gap.double().square() >= floor).all()


def test_loss_is_bit_identical_whatever_the_search_precision():
    """The search only proposes candidates, filtered exactly: bfloat16 and float32 searches give the same loss bits."""
    torch.manual_seed(6)
    z = torch.nn.functional.normalize(torch.randn(24, 8), dim=1)
    y = torch.randint(0, 30, (24,))
    losses = [
        PFMLLoss(30, 8, 3, delta=0.5, pair_search="neighbour", search_dtype=dtype)
        for dtype in (torch.bfloat16, torch.float32)
    ]
    losses[1].load_state_dict(losses[0].state_dict())
    optimisers = [torch.optim.Adam(loss.parameters(), lr=0.05) for loss in losses]
    for _ in range(6):
        values, grads = [], []
        for loss, optimiser in zip(losses, optimisers):
            optimiser.zero_grad()
            value = loss(z, y)
            value.backward()
            values.append(value.item())
            grads.append(loss.proxies.grad.clone())
            optimiser.step()
        assert values[0] == values[1] and torch.equal(grads[0], grads[1])
    assert losses[0].neighbour_stats()["pairs"] > 0
