"""W₂ (PFML Table 3) and AvgDTP (RSW Table III) of a finished run, against literal evaluations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dmlrepro.train import ConfigError, load_latest, resolve_run_config, train_run
from dmlrepro.train.model_and_loss import build_run_loss, build_run_model
from dmlrepro.train.run_data import build_train_eval, open_manifest
from dmlrepro.train.run_evaluation import compute_embeddings


def final_state(cfg, outdir):
    """Model, loss and the train split's embeddings (eval transform) from the run's final checkpoint."""
    cfg = resolve_run_config(cfg)
    state, _ = load_latest(outdir / "checkpoints")
    model = build_run_model(cfg)
    model.load_state_dict(state["model"])
    manifest = open_manifest(cfg["dataset"])
    emb, labels, _ = compute_embeddings(
        model, build_train_eval(cfg["dataset"], manifest, model), batch_size=512, device=torch.device("cpu")
    )
    classes = np.unique(labels)
    loss = build_run_loss(cfg, len(classes), model.embedding_size)
    loss.load_state_dict(state["loss"])
    return emb.astype(np.float64), np.searchsorted(classes, labels), loss


@pytest.mark.slow
def test_w2_of_pfml_proxies_equals_a_literal_assignment(tiny, tmp_path):
    cfg = tiny(eval__proxy_metrics=["w2"], loss__hparams={"proxies_per_class": 2})
    record = train_run(cfg, tmp_path / "run", progress=False)
    emb, labels, loss = final_state(cfg, tmp_path / "run")
    proxies = loss.proxies.detach().double().numpy()
    per_class = []
    for c in range(loss.num_classes):  # W_c = min over distinct a ≠ b of (‖p_c0 − z_a‖ + ‖p_c1 − z_b‖) / 2
        z = emb[labels == c]
        d = np.linalg.norm(proxies[2 * c : 2 * c + 2, None, :] - z[None], axis=-1)
        per_class.append(min((d[0, a] + d[1, b]) / 2 for a, b in itertools.permutations(range(len(z)), 2)))
    assert record["proxy_metrics"]["w2"] == pytest.approx(np.mean(per_class), rel=1e-5)
    assert record["proxy_metrics"]["proxy_delta"] == cfg["loss"]["hparams"].get("delta", 0.2)  # W₂'s gate (eq. 16)


@pytest.mark.slow
def test_avg_dtp_of_rsw_proxies_equals_a_literal_loop(tiny, tmp_path):
    cfg = tiny(
        eval__proxy_metrics=["avg_dtp"],
        loss__name="rsw",
        loss__hparams={"alpha": 2.0, "k1": 0.5, "k2": 1.5},
        model__l2_normalize=False,
    )
    record = train_run(cfg, tmp_path / "run", progress=False)
    emb, labels, loss = final_state(cfg, tmp_path / "run")
    proxies = loss.proxies.detach().double().numpy()
    per_class = [np.mean([np.linalg.norm(e - proxies[c]) for e in emb[labels == c]]) for c in range(loss.num_classes)]
    assert record["proxy_metrics"]["avg_dtp"] == pytest.approx(np.mean(per_class), rel=1e-5)


@pytest.mark.parametrize(
    "loss,metrics,message",
    [
        ({"name": "triplet", "hparams": {}}, ["w2"], "no proxies"),
        ({"name": "pfml", "hparams": {"proxies_per_class": 2}}, ["avg_dtp"], "one proxy per class"),
    ],
)
def test_unusable_proxy_metrics_are_rejected_before_training(tiny, tmp_path, loss, metrics, message):
    with pytest.raises(ConfigError, match=message):
        train_run(tiny(eval__proxy_metrics=metrics, loss=loss), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_run_without_proxies_records_no_proxy_metric():
    """PFML's M = 0 ablation (Fig. 3a) has no proxies: W₂ and AvgDTP are not defined, so none is recorded
    (the run shares its config, eval.proxy_metrics included, with the sweep's other points)."""
    from dmlrepro.losses import build_loss
    from dmlrepro.train.hooks import proxy_metrics

    class Embedder:
        def embed(self, dataset, desc):
            raise AssertionError("a run without proxies embeds nothing for its proxy metrics")

    loss = build_loss("pfml", 2, 8, proxies_per_class=0)
    cfg = {"eval": {"proxy_metrics": ["w2", "avg_dtp"], "w_power": 2}}
    assert proxy_metrics(cfg, Embedder(), None, lambda y: y, loss) == {}


@pytest.mark.slow
def test_a_pfml_run_records_the_proxy_trap_diagnostics(tiny, tmp_path):
    """eval.proxy_metrics [trap]: metrics.json carries the spread over δ and the zero-gradient share of the final
    proxies, recomputed here from the final checkpoint, and Adam's step ratio (dmlrepro.evaluation.proxy_trap)."""
    from dmlrepro.evaluation.proxy_trap import intra_class_spread, sampler_batches, zero_gradient_share

    cfg = tiny(eval__proxy_metrics=["w2", "trap"], loss__hparams={"proxies_per_class": 2})
    record = train_run(cfg, tmp_path / "run", progress=False)
    emb, labels, loss = final_state(cfg, tmp_path / "run")
    resolved = resolve_run_config(cfg)
    delta, data = loss.delta_att, resolved["dataset"]
    m = data["m"] if data["sampler"] == "m_per_class" else None
    batches = sampler_batches(labels, data["batch_size"], m, n_batches=20, seed=resolved["seed"])
    proxy_labels = np.repeat(np.arange(loss.num_classes), 2)
    found = record["proxy_metrics"]
    assert found["proxy_spread"] == pytest.approx(intra_class_spread(loss.proxies.detach(), proxy_labels) / delta)
    assert found["zero_grad_share"] == pytest.approx(
        zero_gradient_share(loss, loss.proxies, emb.astype(np.float32), labels, batches), abs=0.02
    )
    assert found["step_ratio"] > 0
