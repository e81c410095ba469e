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


# ---- eval.nmi options: the official RSW computation (docs/readings/rsw.md#rsw-r8) -----------------


def _brute_force_nmi(labels, clusters, average):
    """NMI from the contingency table in float64, written out from the definitions:
    I(Y; C) / mean(H(Y), H(C)), the mean arithmetic ((a + b) / 2) or geometric (sqrt(a·b))."""
    labels, clusters = list(labels), list(clusters)
    n = len(labels)
    ys, cs = sorted(set(labels)), sorted(set(clusters))
    count = {(y, c): 0 for y in ys for c in cs}
    for y, c in zip(labels, clusters):
        count[(y, c)] += 1
    py = {y: sum(count[(y, c)] for c in cs) / n for y in ys}
    pc = {c: sum(count[(y, c)] for y in ys) / n for c in cs}
    mi = sum(
        (count[(y, c)] / n) * np.log((count[(y, c)] / n) / (py[y] * pc[c])) for y in ys for c in cs if count[(y, c)]
    )
    hy = -sum(p * np.log(p) for p in py.values())
    hc = -sum(p * np.log(p) for p in pc.values())
    mean = (hy + hc) / 2 if average == "arithmetic" else np.sqrt(hy * hc)
    return float(mi / mean)


def _uneven_blobs(seed=3):
    """6 well-separated blobs of unequal size; 60 % of the labels set to class 0, so
    H(labels) != H(clusters) and the arithmetic and geometric means differ."""
    rng = np.random.default_rng(seed)
    sizes = [10, 20, 30, 40, 50, 60]
    blob = np.repeat(np.arange(6), sizes)
    x = (np.eye(6, 8)[blob] * 50.0 + rng.normal(size=(len(blob), 8))).astype(np.float32)
    labels = blob.copy()
    labels[rng.random(len(labels)) < 0.6] = 0  # 60 % relabelled to class 0: a skewed label entropy
    return x, blob, labels


@pytest.mark.parametrize("method", ["arithmetic", "geometric"])
def test_brute_force_nmi_equals_sklearn(method):
    _, blob, labels = _uneven_blobs()
    expected = _brute_force_nmi(labels, blob, method)
    assert normalized_mutual_info_score(labels, blob, average_method=method) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("method", ["arithmetic", "geometric"])
def test_sklearn_nmi_against_brute_force(method):
    """scikit-learn's k-means++ with 10 restarts recovers the unequal blobs (faiss's random starts
    need not: its path is tested on equal blobs above), so the NMI is the brute-force NMI of
    (labels, blobs) under the requested average."""
    x, blob, labels = _uneven_blobs()
    expected = _brute_force_nmi(labels, blob, method)
    got = nmi(x, labels, seed=0, average_method=method, kmeans="sklearn")
    assert got == pytest.approx(expected, abs=1e-12)


def test_geometric_and_arithmetic_differ_here():
    _, blob, labels = _uneven_blobs()
    a, g = (_brute_force_nmi(labels, blob, m) for m in ("arithmetic", "geometric"))
    assert abs(a - g) > 1e-3


def test_sklearn_kmeans_is_the_rsw_code_call():
    """On unstructured data (k-means depends on its start) the sklearn back end gives exactly what
    the RSW code's KMeans(num_classes).fit(x) gives with scikit-learn 1.0.2's defaults, seeded."""
    from sklearn.cluster import KMeans

    from dmlrepro.evaluation.clustering import sklearn_kmeans_assignments

    rng = np.random.default_rng(4)
    x = rng.normal(size=(200, 6)).astype(np.float32)
    y = rng.integers(0, 7, size=200)
    ref = KMeans(n_clusters=7, n_init=10, random_state=5).fit(x).labels_
    assert np.array_equal(sklearn_kmeans_assignments(x, 7, seed=5), ref)
    expected = normalized_mutual_info_score(ref, y, average_method="geometric")  # the RSW code's argument order
    assert nmi(x, y, seed=5, kmeans="sklearn", average_method="geometric") == pytest.approx(expected, abs=1e-12)


def test_nmi_options_values():
    from dmlrepro.evaluation.clustering import NMI_DEFAULTS, nmi_options

    assert nmi_options(False) is None
    assert nmi_options(True) == NMI_DEFAULTS == {"average": "arithmetic", "kmeans": "faiss", "n_init": 10}
    assert nmi_options({"average": "geometric", "kmeans": "sklearn"}) == {
        "average": "geometric",
        "kmeans": "sklearn",
        "n_init": 10,
    }
    for bad in ("yes", 1, {"avg": "geometric"}, {"average": "max"}, {"kmeans": "scipy"}, {"n_init": 0}):
        with pytest.raises(ValueError):
            nmi_options(bad)


def test_run_config_eval_nmi_reaches_the_metric():
    """A run's eval.nmi mapping is what embedding_metrics and the final metrics.json compute."""
    from dmlrepro.evaluation import evaluate_embeddings_file, save_embeddings
    from dmlrepro.train.config import ConfigError, resolve_run_config
    from dmlrepro.train.run_evaluation import embedding_metrics

    x, blob, labels = _uneven_blobs()
    rsw = {"average": "geometric", "kmeans": "sklearn"}
    cfg = resolve_run_config({"eval": {"nmi": rsw, "ks": [1]}})
    expected = _brute_force_nmi(labels, blob, "geometric")
    assert embedding_metrics(x, labels, cfg)["nmi"] == pytest.approx(expected, abs=1e-12)
    plain = resolve_run_config({"eval": {"nmi": True, "ks": [1]}})
    assert embedding_metrics(x, labels, plain)["nmi"] == nmi(x, labels, seed=0)  # true: faiss, arithmetic
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = save_embeddings(f"{d}/e.npz", x, labels)
        res = evaluate_embeddings_file(path, ks=(1,), nmi=rsw)
    assert res["metrics"]["nmi"] == pytest.approx(expected, abs=1e-12)
    with pytest.raises(ConfigError, match="eval.nmi"):
        resolve_run_config({"eval": {"nmi": {"average": "max"}}})


def test_the_same_embeddings_are_clustered_once(monkeypatch):
    """A run's final embeddings are scored twice (its last evaluation, then metrics.json from the
    saved file): the second NMI reuses the first k-means; other data, seeds or options cluster again."""
    from dmlrepro.evaluation import clustering

    calls = []
    real = clustering.sklearn_kmeans_assignments
    monkeypatch.setattr(clustering, "sklearn_kmeans_assignments", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(11)
    x = rng.normal(size=(120, 5)).astype(np.float32)
    y = rng.integers(0, 4, size=120)
    first = nmi(x, y, seed=3, kmeans="sklearn")
    assert nmi(x.copy(), y.copy(), seed=3, kmeans="sklearn") == first and len(calls) == 1
    nmi(x, y, seed=4, kmeans="sklearn")
    nmi(x + 1e-3, y, seed=3, kmeans="sklearn")
    nmi(x, (y + 1) % 4 * (y > 0), seed=3, kmeans="sklearn")
    assert len(calls) == 4
    assert nmi(x, y, seed=3, kmeans="sklearn", average_method="geometric") != first and len(calls) == 5
