"""PFML Table 3 W2 vs a brute force over all injective maps; RSW AvgDTP vs a literal loop."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dmlrepro.evaluation import (
    avg_dtp,
    avg_dtp_per_class,
    pfml_proxy_labels,
    proxy_data_w2,
    proxy_data_w2_per_class,
)


def _w_bruteforce(p, z, w_power):
    """min over injective π: {proxies} -> {samples} of the mean (squared) distance."""
    best = math.inf
    for perm in itertools.permutations(range(len(z)), len(p)):
        costs = [math.dist(p[k], z[perm[k]]) ** w_power for k in range(len(p))]
        best = min(best, sum(costs) / len(p))
    return best if w_power == 1 else math.sqrt(best)


@pytest.mark.parametrize("w_power", [1, 2])
def test_w2_matches_bruteforce_over_permutations(w_power):
    rng = np.random.default_rng(w_power)
    num_classes, m, dim = 3, 3, 4
    sizes = [5, 4, 6]
    z = rng.normal(size=(sum(sizes), dim))
    y = np.repeat(np.arange(num_classes), sizes)
    perm = rng.permutation(len(y))
    z, y = z[perm], y[perm]
    p = rng.normal(size=(num_classes * m, dim))
    py = pfml_proxy_labels(num_classes, m)
    expected = {c: _w_bruteforce(p[py == c].tolist(), z[y == c].tolist(), w_power) for c in range(num_classes)}
    got = proxy_data_w2_per_class(z, y, p, py, w_power=w_power)
    assert set(got) == set(expected)
    for c in expected:
        assert got[c] == pytest.approx(expected[c], rel=1e-12)
    assert proxy_data_w2(z, y, p, py, w_power=w_power) == pytest.approx(np.mean(list(expected.values())), rel=1e-12)


def test_w2_power_switch_differs_and_single_proxy_is_closest_sample():
    rng = np.random.default_rng(5)
    z = rng.normal(size=(12, 3))
    y = np.repeat([0, 1, 2], 4)
    p = rng.normal(size=(6, 3))
    py = pfml_proxy_labels(3, 2)
    assert proxy_data_w2(z, y, p, py, w_power=1) != pytest.approx(proxy_data_w2(z, y, p, py, w_power=2))
    # m = 1 (PNCA, PA): distance from the proxy to the closest embedding of its class.
    p1 = rng.normal(size=(3, 3))
    got = proxy_data_w2_per_class(z, y, p1, np.arange(3))
    for c in range(3):
        assert got[c] == pytest.approx(min(math.dist(p1[c], e) for e in z[y == c]), rel=1e-12)
        # for one proxy, w_power only changes sqrt(mean(d^2)) of one term: equal values
    assert proxy_data_w2(z, y, p1, np.arange(3), w_power=2) == pytest.approx(
        proxy_data_w2(z, y, p1, np.arange(3), w_power=1), rel=1e-12
    )


def test_w2_fewer_samples_than_proxies_warns_and_matches_bruteforce():
    rng = np.random.default_rng(7)
    z = rng.normal(size=(2, 3))
    p = rng.normal(size=(4, 3))
    with pytest.warns(UserWarning, match="fewer embeddings than proxies"):
        got = proxy_data_w2(z, [0, 0], p, [0, 0, 0, 0])
    # every sample matched to a distinct proxy, mean over the 2 pairs
    best = min((math.dist(z[0], p[a]) + math.dist(z[1], p[b])) / 2 for a, b in itertools.permutations(range(4), 2))
    assert got == pytest.approx(best, rel=1e-12)


def test_w2_errors():
    z = np.zeros((4, 2))
    with pytest.raises(ValueError, match="no embeddings"):
        proxy_data_w2(z, [0, 0, 0, 0], np.ones((2, 2)), [0, 1])
    with pytest.raises(ValueError, match="w_power"):
        proxy_data_w2(z, [0, 0, 0, 0], np.ones((1, 2)), [0], w_power=3)
    with pytest.raises(ValueError, match="empty"):
        proxy_data_w2(z, [0, 0, 0, 0], np.ones((0, 2)), [])


def test_avg_dtp_matches_literal_loop():
    rng = np.random.default_rng(0)
    num_classes, dim = 5, 6
    y = rng.integers(0, num_classes, size=80)
    y[:num_classes] = np.arange(num_classes)
    e = rng.normal(size=(80, dim)) * 3
    p = rng.normal(size=(num_classes, dim))
    expected_terms = []
    for c in range(num_classes):
        members = [e[i] for i in range(len(y)) if y[i] == c]
        expected_terms.append(sum(math.dist(v, p[c]) for v in members) / len(members))
    expected = sum(expected_terms) / num_classes
    assert avg_dtp(e, y, p) == pytest.approx(expected, rel=1e-12)
    per = avg_dtp_per_class(e, y, p)
    for c in range(num_classes):
        assert per[c] == pytest.approx(expected_terms[c], rel=1e-12)
    # Explicit proxy labels in another order give the same value.
    order = rng.permutation(num_classes)
    assert avg_dtp(e, y, p[order], proxy_labels=order) == pytest.approx(expected, rel=1e-12)
    # Classes without samples are left out (1/|P_c| undefined): extra proxies change nothing.
    p_more = np.concatenate([p, rng.normal(size=(3, dim))])
    assert avg_dtp(e, y, p_more) == pytest.approx(expected, rel=1e-12)


def test_avg_dtp_errors():
    e = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"integers in \[0, 2\)"):
        avg_dtp(e, [0, 1, 2], np.ones((2, 2)))
    with pytest.raises(ValueError, match="one proxy per class"):
        avg_dtp(e, [0, 1, 1], np.ones((3, 2)), proxy_labels=[0, 1, 1])
    with pytest.raises(ValueError, match="labels without a proxy"):
        avg_dtp(e, [0, 1, 5], np.ones((2, 2)), proxy_labels=[0, 1])
