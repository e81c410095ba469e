"""Greedy k-Center proxy selection (Alg. 2) against a brute-force farthest-first on small inputs."""

import pytest
import torch

from dmlrepro.asap import (
    covering_radius,
    farthest_first,
    initial_proxies,
    mean_class_covering_radius,
    pool_size,
    sample_pools,
    select_proxies,
)

import asap_reference as ref


def _table(n=40, d=3, num_classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n, d, generator=g, dtype=torch.float64) * 2
    labels = torch.arange(n) % num_classes
    return feats, labels


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k,n,m", [(1, 5, 0), (3, 7, 2), (4, 12, 8), (7, 7, 3)])
def test_farthest_first_matches_brute_force(seed, k, n, m):
    g = torch.Generator().manual_seed(seed)
    pools = torch.randn(3, n, 4, generator=g, dtype=torch.float64)
    centers = torch.randn(3, m, 4, generator=g, dtype=torch.float64)
    got = farthest_first(pools, k, centers if m else None)
    for c in range(3):
        if m:
            expected = ref.farthest_first(list(pools[c]), k, list(centers[c]))
        else:  # no seeds: the first pick is pool position 0, then farthest-first
            expected = _unseeded(pools[c], k)
        assert got[c].tolist() == expected


def _unseeded(pool, k):
    chosen = [0]
    while len(chosen) < k:
        rest = [u for u in range(len(pool)) if u not in chosen]
        vals = [min(float(ref.dist(pool[u], pool[j])) for j in chosen) for u in rest]
        chosen.append(rest[vals.index(max(vals))])
    return chosen


def test_seeding_with_existing_proxies_changes_the_picks():
    """Points on a line 0..5; with a centre at 5 the first pick is 0, without seeds (start 0) it is 5."""
    pool = torch.arange(6, dtype=torch.float64).view(6, 1)
    seeds = torch.tensor([[5.0]], dtype=torch.float64)
    assert farthest_first(pool, 2, seeds).tolist() == ref.farthest_first(list(pool), 2, list(seeds)) == [0, 2]
    assert farthest_first(pool, 2, None).tolist() == [0, 5]
    # a seed at 2.5 makes the two ends tie: the lower pool position wins, then the other end
    assert farthest_first(pool, 2, torch.tensor([[2.5]], dtype=torch.float64)).tolist() == [0, 5]


def test_picks_are_distinct_even_with_duplicate_points():
    pool = torch.zeros(4, 2, dtype=torch.float64)
    picked = farthest_first(pool, 4, torch.ones(1, 2, dtype=torch.float64))
    assert sorted(picked.tolist()) == [0, 1, 2, 3]


def test_pool_size_rules():
    assert pool_size(12, 8) == 12 and pool_size(7, 4) == 7 and pool_size(8, 8) == 8
    assert pool_size(1, 8) == 8 and pool_size(3, 4) == 12  # b < P: b·P (later code)
    assert pool_size(3, 4, small_budget="clip") == 4
    with pytest.raises(ValueError):
        pool_size(0, 4)


def test_sample_pools_without_replacement_and_wrap():
    labels = torch.tensor([0] * 10 + [1] * 3)
    pools = sample_pools(labels, 2, 6, torch.Generator().manual_seed(0))
    assert len(set(pools[0].tolist())) == 6 and set(pools[0].tolist()) <= set(range(10))
    # class 1 has 3 samples: two reshuffled passes, each sample exactly twice
    assert sorted(pools[1].tolist()) == [10, 10, 11, 11, 12, 12]
    again = sample_pools(labels, 2, 6, torch.Generator().manual_seed(0))
    assert torch.equal(pools, again)


@pytest.mark.parametrize("b,P", [(12, 8), (7, 4), (5, 2)])
def test_select_proxies_matches_brute_force(b, P):
    feats, labels = _table()
    embed = lambda idx: feats[idx]  # noqa: E731
    g = torch.Generator().manual_seed(1)
    current = torch.randn(4, P, 3, generator=g, dtype=torch.float64)
    sel = select_proxies(embed, labels, current, b, torch.Generator().manual_seed(7))
    assert sel.pool.shape == (4, b) and sel.indices.shape == (4, P) and sel.proxies.shape == (4, P, 3)
    for c in range(4):
        assert (labels[sel.pool[c]] == c).all()
        expected = ref.farthest_first(list(feats[sel.pool[c]]), P, list(current[c]))
        assert sel.picked[c].tolist() == expected
        assert sel.indices[c].tolist() == sel.pool[c, expected].tolist()
        torch.testing.assert_close(sel.proxies[c], feats[sel.indices[c]])
    again = select_proxies(embed, labels, current, b, torch.Generator().manual_seed(7))
    assert torch.equal(sel.indices, again.indices)


def test_b_equal_1_is_random_sampling():
    feats, labels = _table()
    embed = lambda idx: feats[idx]  # noqa: E731
    current = torch.zeros(4, 3, 3, dtype=torch.float64)
    a = select_proxies(embed, labels, current, 1, torch.Generator().manual_seed(3))
    b = select_proxies(embed, labels, current, 1, torch.Generator().manual_seed(3))
    c = select_proxies(embed, labels, current, 1, torch.Generator().manual_seed(4))
    assert a.pool.shape == (4, 3)
    assert torch.equal(a.indices, a.pool)  # all P random draws, in draw order
    assert torch.equal(a.indices, b.indices)  # deterministic given the seed
    assert not torch.equal(a.indices, c.indices)  # and random across seeds
    for row in range(4):
        assert len(set(a.indices[row].tolist())) == 3 and (labels[a.indices[row]] == row).all()


def test_b_equal_P_takes_the_whole_pool():
    feats, labels = _table()
    embed = lambda idx: feats[idx]  # noqa: E731
    current = torch.randn(4, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    sel = select_proxies(embed, labels, current, 5, torch.Generator().manual_seed(2))
    for c in range(4):
        assert sorted(sel.indices[c].tolist()) == sorted(sel.pool[c].tolist())
        assert sel.picked[c].tolist() == ref.farthest_first(list(feats[sel.pool[c]]), 5, list(current[c]))


def test_normalized_pool_option():
    """ASAP-R6 switch: with normalize=True the comparison is between 𝒩(pool) and 𝒩(centres)."""
    feats, labels = _table(seed=4)
    feats = feats * 3
    embed = lambda idx: feats[idx]  # noqa: E731
    current = torch.randn(4, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    sel = select_proxies(embed, labels, current, 8, torch.Generator().manual_seed(0), normalize=True)
    for c in range(4):
        pool = [ref.lip(v) for v in feats[sel.pool[c]]]
        assert sel.picked[c].tolist() == ref.farthest_first(pool, 2, [ref.lip(v) for v in current[c]])
        torch.testing.assert_close(sel.proxies[c], feats[sel.indices[c]])  # proxies stay raw


def test_initial_proxies_modes():
    feats, labels = _table()
    embed = lambda idx: feats[idx]  # noqa: E731
    rand = initial_proxies(embed, labels, 4, 2, 6, torch.Generator().manual_seed(0), first_init="random")
    assert torch.equal(rand.indices, rand.pool)
    kc = initial_proxies(embed, labels, 4, 2, 6, torch.Generator().manual_seed(0))
    # same generator stream: the random ρ* is `rand`; k-Center then seeds from it
    for c in range(4):
        assert kc.picked[c].tolist() == ref.farthest_first(list(feats[kc.pool[c]]), 2, list(rand.proxies[c]))
    zero = initial_proxies(embed, labels, 4, 2, 6, torch.Generator().manual_seed(0), first_init="kcenter_from_zero")
    for c in range(4):
        first = zero.pool[c][feats[zero.pool[c]].norm(dim=1).argmax()]
        assert zero.indices[c, 0] == first  # the largest-norm sample comes first
    with pytest.raises(ValueError, match="first_init"):
        initial_proxies(embed, labels, 4, 2, 6, torch.Generator(), first_init="zeros")


def test_covering_radius():
    pts = torch.tensor([[0.0, 0.0], [3.0, 4.0], [1.0, 0.0]])
    assert covering_radius(pts, torch.tensor([[0.0, 0.0]])) == pytest.approx(5.0)
    assert covering_radius(pts, pts) == pytest.approx(0.0)
    labels = torch.tensor([0, 0, 1])
    proxies = torch.tensor([[[0.0, 0.0]], [[1.0, 1.0]]])
    assert mean_class_covering_radius(pts, labels, proxies) == pytest.approx((5.0 + 1.0) / 2)
