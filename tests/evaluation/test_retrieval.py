"""retrieval_metrics / retrieval_metrics_query_gallery against a float64 brute force and PML."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

from dmlrepro.evaluation import (
    compute_retrieval,
    knn_search,
    retrieval_metrics,
    retrieval_metrics_query_gallery,
)

KS = (1, 2, 4, 8, 16)
KEYS = [f"recall@{k}" for k in KS] + ["precision@1", "r_precision", "map@r"]
# (n, dim, seed): seeds chosen so that the data has no exact relevant/irrelevant distance tie in
# any query's searched window (asserted below), i.e. the ranking is unique.
CASES = [(60, 8, 0), (400, 16, 4), (800, 24, 6), (1500, 32, 2)]
BACKENDS = ("faiss-cpu", "torch")


def _assert_same(a, b, tol=1e-12):
    assert set(a) == set(b)
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=tol), key


def _window(labels):
    counts = np.unique(labels, return_counts=True)[1]
    return max(max(KS), int(counts.max()) - 1) + 1


def _pml(x, y, gx=None, gy=None):
    calc = AccuracyCalculator(
        include=("precision_at_1", "r_precision", "mean_average_precision_at_r"),
        k="max_bin_count",
    )
    xt, yt = torch.from_numpy(x), torch.from_numpy(np.asarray(y))
    if gx is None:
        return calc.get_accuracy(xt, yt, xt, yt, ref_includes_query=True)
    return calc.get_accuracy(xt, yt, torch.from_numpy(gx), torch.from_numpy(np.asarray(gy)), ref_includes_query=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,dim,seed", CASES)
def test_matches_bruteforce_and_pml(n, dim, seed, backend, clustered, reference, sqdist, relevance_gap):
    x, y = clustered(n, dim, seed)
    dist = sqdist(x)
    # Precondition: the exact ranking is unique where it matters (see conftest.make_clustered).
    assert relevance_gap(dist, y, y, _window(y), self_search=True) > 0
    assert (np.unique(y, return_counts=True)[1] == 1).sum() == 3  # lone classes are present

    ours = retrieval_metrics(x, y, ks=KS, backend=backend)
    ref = reference(dist, y, y, KS, self_search=True)
    assert set(ours) == set(KEYS)
    for key in KEYS:
        assert isinstance(ours[key], float) and 0.0 <= ours[key] <= 1.0
        assert ours[key] == pytest.approx(ref[key], abs=1e-9), key
    # Non-trivial data: neither perfect nor chance.
    assert 0.2 < ours["map@r"] < 0.99

    pml = _pml(x, y)
    assert ours["precision@1"] == pytest.approx(pml["precision_at_1"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(pml["r_precision"], abs=1e-6)
    assert ours["map@r"] == pytest.approx(pml["mean_average_precision_at_r"], abs=1e-6)


def test_lone_queries_are_excluded(clustered, reference, sqdist):
    x, y = clustered(60, 8, 0)
    res = compute_retrieval(x, y, KS)
    assert res.num_excluded == 3 and res.num_queries == 57
    # The reference skips queries with R = 0 but keeps those items as (irrelevant) neighbours.
    full = reference(sqdist(x), y, y, KS, self_search=True)
    for key in full:
        assert res.metrics[key] == pytest.approx(full[key], abs=1e-9)
    # Averaging over all 60 queries (lone ones as misses) would give 57/60 of it.
    assert res.metrics["recall@1"] != pytest.approx(full["recall@1"] * 57 / 60, abs=1e-6)


def test_inputs_torch_numpy_float64_and_chunking(clustered):
    x, y = clustered(400, 16, 4)
    base = retrieval_metrics(x, y, ks=KS)
    _assert_same(retrieval_metrics(torch.from_numpy(x), torch.from_numpy(y), ks=KS), base)
    _assert_same(retrieval_metrics(x.astype(np.float64), y.tolist(), ks=KS), base)
    for chunk in (1, 37, 399, 400, 10_000):
        _assert_same(retrieval_metrics(x, y, ks=KS, chunk_size=chunk), base)
        _assert_same(retrieval_metrics(x, y, ks=KS, chunk_size=chunk, backend="torch"), base)
    _assert_same(retrieval_metrics(torch.from_numpy(x), y, ks=KS, backend="torch"), base)
    # String labels work like integer labels.
    _assert_same(retrieval_metrics(x, np.array([f"c{v}" for v in y]), ks=KS), base)


def test_recall_k_larger_than_n_is_clamped(clustered, reference, sqdist):
    x, y = clustered(60, 8, 0)
    ks = (1, 10, 100, 1000)
    ours = retrieval_metrics(x, y, ks=ks)
    ref = reference(sqdist(x), y, y, ks, self_search=True)
    for key in ref:
        assert ours[key] == pytest.approx(ref[key], abs=1e-9)
    assert ours["recall@100"] == ours["recall@1000"] == 1.0


# --- ties and duplicates ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicate_of_query_counts_but_query_never_does(backend):
    # Item 0 and item 1 are the same vector with the same label; items 2..5 are other classes,
    # all farther away. Whatever order a backend finds the two distance-0 items in, the query
    # itself must be dropped and its duplicate must be its first neighbour.
    x = np.array([[0, 0], [0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=np.float32)
    y = np.array([5, 5, 1, 2, 3, 4])
    _, idx = knn_search(x, 3, backend=backend)
    assert idx[0, 0] == 1 and idx[1, 0] == 0
    assert all(i not in idx[i] for i in range(len(x)))
    m = compute_retrieval(x, y, ks=(1, 2), backend=backend)
    assert m.num_queries == 2  # only the two duplicates have a class mate
    assert m.metrics["precision@1"] == 1.0 and m.metrics["map@r"] == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_duplicates_self_not_returned_drops_last(backend):
    # 6 identical copies of one vector: searching k+1 = 3 of them, the query's own index may or
    # may not be among the 3 returned; either way it must not appear and every neighbour must be
    # one of the copies (distance 0).
    x = np.zeros((6, 4), dtype=np.float32)
    x = np.concatenate([x, np.eye(4, dtype=np.float32) * 3])
    dist, idx = knn_search(x, 2, backend=backend)
    for q in range(6):
        assert q not in idx[q]
        assert set(idx[q]) <= set(range(6)) - {q}
        assert np.all(dist[q] == 0)


def test_drop_self_rule():
    from dmlrepro.evaluation.knn import _drop_self

    idx = np.array([[10, 4, 7], [2, 11, 9], [3, 5, 6]])  # rows are items 10, 11, 12
    sc = np.arange(9, dtype=np.float32).reshape(3, 3)
    i2, s2 = _drop_self(idx, sc, start=10)
    np.testing.assert_array_equal(i2, [[4, 7], [2, 9], [3, 5]])  # self removed / last dropped
    np.testing.assert_array_equal(s2, [[1, 2], [3, 5], [6, 7]])


def test_ties_follow_the_index_rule(reference, sqdist):
    # Integer lattice data: many exact distance ties, also between relevant and irrelevant
    # items, and exact duplicates. Every metric is monotone in moving relevant items ahead
    # within a tie group, so any valid tie order lies between the pessimistic and optimistic
    # brute-force values (PML's is one of them); ours is exactly the index-order one.
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 3, size=(300, 3)).astype(np.float32)
    y = rng.integers(0, 12, size=300)
    dist = sqdist(x)
    ks = (1, 2, 4, 8)
    lo = reference(dist, y, y, ks, self_search=True, tie="pessimistic")
    hi = reference(dist, y, y, ks, self_search=True, tie="optimistic")
    assert any(hi[k] - lo[k] > 0.01 for k in lo)  # the data really has decisive ties
    stable = reference(dist, y, y, ks, self_search=True, tie="stable")
    for backend in BACKENDS:
        ours = retrieval_metrics(x, y, ks=ks, backend=backend)
        for key in lo:
            assert lo[key] - 1e-9 <= ours[key] <= hi[key] + 1e-9, key
            assert ours[key] == pytest.approx(stable[key], abs=1e-12), (backend, key)
    pml = _pml(x, y)
    assert lo["map@r"] - 1e-9 <= pml["mean_average_precision_at_r"] <= hi["map@r"] + 1e-9


# --- cosine vs euclidean ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_cosine_equals_euclidean_on_normalised(backend, clustered, cosdist, reference, relevance_gap):
    x, y = clustered(800, 24, 6, quantize=False)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    dist = cosdist(x)
    assert relevance_gap(dist, y, y, _window(y), self_search=True) > 1e-5  # float32-safe margin
    ref = reference(dist, y, y, KS, self_search=True)
    cos = retrieval_metrics(x, y, ks=KS, distance="cosine", backend=backend)
    euc = retrieval_metrics(xn, y, ks=KS, distance="euclidean", backend=backend)
    for key in KEYS:
        assert cos[key] == pytest.approx(ref[key], abs=1e-9)
        assert euc[key] == pytest.approx(ref[key], abs=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unnormalised_euclidean_differs_from_cosine(backend, clustered, sqdist, cosdist, reference, relevance_gap):
    # Hand-made case: for query a=(1,0) the same-class item (10,0) is the cosine nearest
    # neighbour, but the other-class item (0.9,0.5) is the Euclidean nearest one.
    x = np.array([[1, 0], [10, 0], [0.9, 0.5], [0, -3], [0.1, -2.0]], dtype=np.float32)
    y = np.array([0, 0, 1, 2, 2])
    q = retrieval_metrics(x, y, ks=(1,), distance="euclidean", backend=backend)
    c = retrieval_metrics(x, y, ks=(1,), distance="cosine", backend=backend)
    # Queries with a class mate: a, a2, c1, c2 (b is lone). Euclidean: a -> b is a miss, the
    # other three hit. Cosine: all four hit.
    assert q["precision@1"] == pytest.approx(3 / 4)
    assert c["precision@1"] == pytest.approx(4 / 4)

    # Random clustered data with random norms (RSW evaluates unnormalised embeddings).
    x, y = clustered(400, 16, 4, quantize=False)
    scale = np.random.default_rng(0).uniform(0.3, 3.0, size=(len(x), 1)).astype(np.float32)
    xs = x * scale
    d_euc, d_cos = sqdist(xs), cosdist(xs)
    assert relevance_gap(d_euc, y, y, _window(y), self_search=True) > 1e-5
    assert relevance_gap(d_cos, y, y, _window(y), self_search=True) > 1e-5
    euc = retrieval_metrics(xs, y, ks=KS, distance="euclidean", backend=backend)
    cos = retrieval_metrics(xs, y, ks=KS, distance="cosine", backend=backend)
    ref_euc = reference(d_euc, y, y, KS, self_search=True)
    ref_cos = reference(d_cos, y, y, KS, self_search=True)
    for key in KEYS:
        assert euc[key] == pytest.approx(ref_euc[key], abs=1e-9)
        assert cos[key] == pytest.approx(ref_cos[key], abs=1e-9)
    assert abs(euc["map@r"] - cos["map@r"]) > 0.01
    # Cosine is invariant to the norms; unnormalised Euclidean is not.
    cos_unscaled = retrieval_metrics(x, y, ks=KS, distance="cosine", backend=backend)
    for key in KEYS:
        assert cos[key] == pytest.approx(cos_unscaled[key], abs=1e-9)


# --- query -> gallery -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [10, 11])
def test_query_gallery_matches_bruteforce_and_pml(seed, backend, clustered, sqdist, reference, relevance_gap):
    x, y = clustered(900, 32, seed)
    rng = np.random.default_rng(seed)
    is_query = rng.random(len(x)) < 0.4
    qx, qy, gx, gy = x[is_query], y[is_query], x[~is_query], y[~is_query]
    ks = (1, 10, 20, 30, 40, 50)
    dist = sqdist(qx, gx)
    counts = np.unique(gy, return_counts=True)[1]
    assert relevance_gap(dist, qy, gy, max(50, counts.max()) + 1, self_search=False) > 0
    assert not np.isin(qy, gy).all()  # some queries have no gallery match -> excluded
    ours = retrieval_metrics_query_gallery(qx, qy, gx, gy, ks=ks, backend=backend)
    ref = reference(dist, qy, gy, ks, self_search=False)
    for key in ref:
        assert ours[key] == pytest.approx(ref[key], abs=1e-9), key
    pml = _pml(qx, qy, gx, gy)
    assert ours["precision@1"] == pytest.approx(pml["precision_at_1"], abs=1e-6)
    assert ours["map@r"] == pytest.approx(pml["mean_average_precision_at_r"], abs=1e-6)
    assert ours["r_precision"] == pytest.approx(pml["r_precision"], abs=1e-6)


# --- bad input ----------------------------------------------------------------------------------


def test_bad_input_fails_early():
    x = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    y = np.arange(10)
    with pytest.raises(ValueError, match="no query has another item"):
        retrieval_metrics(x, y)
    y = np.repeat([0, 1], 5)
    with pytest.raises(ValueError, match="labels has 9 entries"):
        retrieval_metrics(x, y[:9])
    with pytest.raises(ValueError, match="distance must be one of"):
        retrieval_metrics(x, y, distance="manhattan")
    with pytest.raises(ValueError, match="positive integer"):
        retrieval_metrics(x, y, ks=(0, 1))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        retrieval_metrics(x, y, chunk_size=0)
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        retrieval_metrics(bad, y)
    with pytest.raises(ValueError, match="2-D"):
        retrieval_metrics(x[:, 0], y)


def test_cuda_or_faiss_gpu_request_without_them_is_an_error():
    import faiss

    x = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
            retrieval_metrics(x, np.repeat([0, 1], 5), device="cuda")
    if not (hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0):
        with pytest.raises(ValueError, match="faiss sees 0 GPU"):
            retrieval_metrics(x, np.repeat([0, 1], 5), backend="faiss-gpu")
    with pytest.raises(ValueError, match="knn backend must be one of"):
        retrieval_metrics(x, np.repeat([0, 1], 5), backend="gpu")
