"""𝒩(v) = v / max(1, ‖v‖) (paper §4.4) against a per-vector float64 reference."""

import pytest
import torch

from dmlrepro.asap import lipschitz_normalize, normalize

import asap_reference as ref


def test_lipschitz_normalize_matches_reference():
    g = torch.Generator().manual_seed(0)
    v = (
        torch.randn(50, 7, generator=g, dtype=torch.float64)
        * torch.linspace(0.05, 1.5, 50, dtype=torch.float64)[:, None]
    )
    out = lipschitz_normalize(v)
    for i in range(50):
        torch.testing.assert_close(out[i], ref.lip(v[i]), rtol=1e-14, atol=0)
    norms = v.norm(dim=1)
    assert (norms < 1).any() and (norms > 1).any()
    assert torch.equal(out[norms <= 1], v[norms <= 1])  # short vectors untouched
    torch.testing.assert_close(out[norms > 1].norm(dim=1), torch.ones(int((norms > 1).sum()), dtype=torch.float64))


def test_continuity_and_lipschitz_bound():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(500, 4, generator=g, dtype=torch.float64)
    b = a + 1e-3 * torch.randn(500, 4, generator=g, dtype=torch.float64)
    ratio = (lipschitz_normalize(a) - lipschitz_normalize(b)).norm(dim=1) / (a - b).norm(dim=1)
    assert float(ratio.max()) <= 2.0  # 2-Lipschitz (App. B.1)
    tiny = torch.tensor([[1e-9, 0.0]], dtype=torch.float64)
    assert torch.equal(lipschitz_normalize(tiny), tiny)  # no blow-up at the origin


def test_modes():
    v = torch.tensor([[0.3, 0.4], [3.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(normalize(v, "l2"), torch.tensor([[0.6, 0.8], [0.6, 0.8]], dtype=torch.float64))
    assert torch.equal(normalize(v, "none"), v)
    with pytest.raises(ValueError):
        normalize(v, "hard")


# ---- evaluation on 𝒩(v) (App. A.2 "Embedding vectors"; docs/readings/asap.md#asap-r32) -------------


def _brute_force_retrieval(emb, labels):
    """Leave-one-out R@1 and MAP@R by double loops over float64 Euclidean distances."""
    import numpy as np

    n = len(labels)
    r1 = map_r = 0.0
    for i in range(n):
        others = sorted((float(np.sqrt(((emb[i] - emb[j]) ** 2).sum())), j) for j in range(n) if j != i)
        rel = [labels[j] == labels[i] for _, j in others]
        big_r = sum(rel)
        r1 += rel[0]
        hits = 0
        ap = 0.0
        for k in range(big_r):
            if rel[k]:
                hits += 1
                ap += hits / (k + 1)
        map_r += ap / big_r
    return r1 / n, map_r / n


def _short_and_long(seed=0):
    """2-d embeddings of 4 classes with norms between 0.1 and 3 (about half below 1)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(4), 12)
    angle = rng.uniform(0, 2 * np.pi, size=48)
    radius = rng.uniform(0.1, 3.0, size=48)
    emb = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).astype(np.float32)
    return emb, labels


def test_normalize_array_is_the_per_vector_transform():
    import numpy as np

    from dmlrepro.asap.normalisation import normalize_array

    emb, _ = _short_and_long()
    out = normalize_array(emb, "lipschitz")
    for v, w in zip(emb.astype(np.float64), out):
        norm = float(np.sqrt((v**2).sum()))
        expected = v if norm <= 1 else v / norm
        np.testing.assert_allclose(w, expected, rtol=1e-6, atol=0)
    norms = np.linalg.norm(emb, axis=1)
    assert (norms < 1).sum() > 10 and (norms > 1).sum() > 10


def test_eval_normalize_lipschitz_against_brute_force(tmp_path):
    """eval.normalize: lipschitz + Euclidean = a brute-force evaluation of v / max(1, ‖v‖), in the
    training engine's metrics and in the final metrics.json; cosine (the L2 reading) differs here."""
    import numpy as np

    from dmlrepro.evaluation import evaluate_embeddings_file, save_embeddings
    from dmlrepro.train.config import ConfigError, resolve_run_config
    from dmlrepro.train.run_evaluation import embedding_metrics

    emb, labels = _short_and_long()
    e64 = emb.astype(np.float64)
    lip = e64 / np.maximum(1.0, np.sqrt((e64**2).sum(1, keepdims=True)))
    unit = e64 / np.sqrt((e64**2).sum(1, keepdims=True))
    r1, map_r = _brute_force_retrieval(lip, labels)
    r1_cos, map_r_cos = _brute_force_retrieval(unit, labels)
    assert (r1, map_r) != (r1_cos, map_r_cos)  # the norms below 1 change the ranking

    cfg = resolve_run_config({"eval": {"normalize": "lipschitz", "distance": "euclidean", "ks": [1]}})
    got = embedding_metrics(emb, labels, cfg)
    assert got["recall@1"] == pytest.approx(r1, abs=1e-9) and got["map@r"] == pytest.approx(map_r, abs=1e-9)
    cos = embedding_metrics(emb, labels, resolve_run_config({"eval": {"distance": "cosine", "ks": [1]}}))
    assert cos["recall@1"] == pytest.approx(r1_cos, abs=1e-9) and cos["map@r"] == pytest.approx(map_r_cos, abs=1e-9)

    path = save_embeddings(tmp_path / "e.npz", emb, labels)
    res = evaluate_embeddings_file(path, ks=(1,), distance="euclidean", normalize="lipschitz")
    assert res["metrics"]["recall@1"] == pytest.approx(r1, abs=1e-9)
    assert res["metrics"]["map@r"] == pytest.approx(map_r, abs=1e-9)
    with pytest.raises(ConfigError, match="eval.normalize"):
        resolve_run_config({"eval": {"normalize": "lipschitz", "distance": "cosine"}})


def test_eval_normalize_equals_cosine_when_every_norm_is_at_least_one():
    """With every ‖v‖ ≥ 1, 𝒩(v) = v/‖v‖: Euclidean on 𝒩 ranks as cosine does (same metrics)."""
    import numpy as np

    from dmlrepro.train.config import resolve_run_config
    from dmlrepro.train.run_evaluation import embedding_metrics

    emb, labels = _short_and_long(1)
    emb = emb * (1.0 + 1.0 / np.linalg.norm(emb, axis=1, keepdims=True)).astype(np.float32)  # all norms > 1
    lip = embedding_metrics(
        emb, labels, resolve_run_config({"eval": {"normalize": "lipschitz", "distance": "euclidean"}})
    )
    cos = embedding_metrics(emb, labels, resolve_run_config({"eval": {"distance": "cosine"}}))
    assert lip == pytest.approx(cos, abs=1e-9)


def test_eval_normalize_is_a_late_default():
    """`eval.normalize: none` leaves a run's id as it was before the key existed; `lipschitz` is another run."""
    import copy

    from dmlrepro.runs import config_hash
    from dmlrepro.train.config import config_identity, resolve_run_config

    plain = resolve_run_config({"eval": {"distance": "euclidean"}})
    assert "normalize" not in config_identity(plain)["eval"]
    old = copy.deepcopy(plain)
    old["eval"].pop("normalize")
    assert config_hash(plain) == config_hash(old)
    explicit = resolve_run_config({"eval": {"distance": "euclidean", "normalize": "none"}})
    assert config_hash(explicit) == config_hash(plain)
    lip = resolve_run_config({"eval": {"distance": "euclidean", "normalize": "lipschitz"}})
    assert config_hash(lip) != config_hash(plain)
