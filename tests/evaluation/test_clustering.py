"""NMI (faiss k-means + sklearn) on clusterings where k-means is unambiguous."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import normalized_mutual_info_score

from dmlrepro.evaluation import kmeans_assignments, nmi

# Blobs 50 apart with radius ~1: the k-means optimum is the blob partition by a wide margin.
# faiss starts Lloyd's iterations from k random points, which can leave two centroids in one
# blob (a local optimum), so the tests use nredo=10 restarts and keep the best objective.
NREDO = 10


def _blobs(seed=0, k=6, per=40, dim=8):
    rng = np.random.default_rng(seed)
    centers = np.eye(k, dim) * 50.0
    blob = np.repeat(np.arange(k), per)
    x = centers[blob] + rng.normal(size=(k * per, dim))
    return x.astype(np.float32), blob


def test_kmeans_recovers_unambiguous_blobs():
    x, blob = _blobs()
    assign = kmeans_assignments(x, 6, seed=0, nredo=NREDO)
    # Same partition up to renaming: a one-to-one map between clusters and blobs.
    pairs = set(zip(assign.tolist(), blob.tolist()))
    assert len(pairs) == 6 and len({a for a, _ in pairs}) == 6


@pytest.mark.parametrize("method", ["arithmetic", "geometric"])
def test_nmi_equals_sklearn_on_noisy_labels(method):
    x, blob = _blobs(seed=1)
    # Labels disagree with the (unambiguous) clusters on 25 % of the items, so NMI is neither
    # 0 nor 1; the expected value comes from sklearn on the known blob partition.
    rng = np.random.default_rng(2)
    labels = blob.copy()
    flip = rng.random(len(labels)) < 0.25
    labels[flip] = rng.integers(0, 6, size=flip.sum())
    labels = labels * 11 + 5  # arbitrary label values
    assert len(np.unique(labels)) == 6
    expected = normalized_mutual_info_score(labels, blob, average_method=method)
    got = nmi(x, labels, seed=0, nredo=NREDO, average_method=method)
    assert 0.3 < expected < 0.95
    assert got == pytest.approx(expected, abs=1e-12)


def test_nmi_is_seeded_and_accepts_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)).astype(np.float32)  # no structure: k-means depends on seed
    y = rng.integers(0, 10, size=300)
    a = nmi(x, y, seed=3)
    assert nmi(torch.from_numpy(x), torch.from_numpy(y), seed=3) == a


def test_nmi_bad_input():
    x = np.zeros((3, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="num_clusters"):
        kmeans_assignments(x, 5)
