"""Validation split, early stopping, best-validation selection and ASAP's alternating projections
inside the training engine (paper Alg. 1, Sec. 4.4, App. A.2; readings ASAP-R3, ASAP-R4, ASAP-R5, ASAP-R7, ASAP-R33).

Everything runs on a tiny synthetic dataset (32 classes x 12 images, 16 training classes) with
the 3-layer tiny CNN and 3 steps per epoch (= one evaluation interval E). One ASAP run (every
checkpoint kept) is shared by the tests that only read its outputs.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import signal

import numpy as np
import pytest
import torch
import yaml

from dmlrepro.train import (
    EXIT_INTERRUPTED,
    ConfigError,
    list_checkpoints,
    read_checkpoint,
    resolve_run_config,
    train_run,
)
from dmlrepro.train.checkpoint import checkpoint_name

from ..conftest import state_differences
from .conftest import SYNTH, run_cli, with_overrides

E = 3  # steps per epoch = steps per evaluation


def asap_config(root, **overrides) -> dict:
    cfg = {
        "dataset": {
            "name": "synthetic",
            "root": str(root),
            "params": dict(SYNTH),
            "sampler": "m_per_class",
            "m": 4,
            "batch_size": 32,
            "image_size": 32,
            "resize": 32,
            "train_crop": "random",
            "eval_batch_size": 512,
        },
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [16, 32, 32], "strides": [2, 2, 2]},
            "embedding_size": 16,
            "l2_normalize": False,
        },
        "loss": {"name": "asap_c2", "hparams": {"proxies_per_class": 2, "pos_margin": 0.0, "neg_margin": 0.3841}},
        "optimizer": {"name": "adam", "lr": 1e-3, "weight_decay": 1e-4},
        "validation": {"split": "fold", "fold": 1, "n_folds": 4, "patience": 12, "min_delta": 1e-3},
        "asap": {"enabled": True, "b": 4, "lam": 2e-4, "projection_patience": 2, "save_val_embeddings": True},
        "eval": {"select": "best_val", "every": 0, "before_training": False},
        "checkpoint": {"keep": 100},
        "steps_per_epoch": E,
        "epochs": 24,
        "seed": 0,
        "threads": 1,
        "device": "cpu",  # CPU-exact values; the CUDA lane is tests/cuda
    }
    return with_overrides(cfg, overrides)


def _trainable_names(cfg: dict) -> list[str]:
    from dmlrepro.train.model_and_loss import build_run_model

    model = build_run_model(resolve_run_config(cfg))
    return [n for n, p in model.named_parameters() if p.requires_grad]


def _ckpt_at_epoch_end(outdir, epoch: int) -> dict:
    """The checkpoint written after `epoch` (and its validation) finished."""
    return read_checkpoint(outdir / "checkpoints" / checkpoint_name(epoch + 1, 0))


@pytest.fixture(scope="module")
def asap_run(synth_root, tmp_path_factory):
    cfg = asap_config(synth_root)
    out = tmp_path_factory.mktemp("asap") / "run"
    metrics = train_run(cfg, out, progress=False)
    log = json.loads((out / "validation_log.json").read_text())
    assert metrics["status"] == "completed"
    return cfg, out, metrics, log


# -- 1. class-disjoint fold training ---------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["linspace", "mlrc"])
@pytest.mark.parametrize("fold", [0, 3])
def test_fold_training_is_class_disjoint(synth_root, scheme, fold):
    from dmlrepro.data.splits import kfold_class_splits, split_indices
    from dmlrepro.train.model_and_loss import build_run_loss, build_run_model
    from dmlrepro.train.run_data import build_datasets, build_validation, open_manifest

    cfg = resolve_run_config(asap_config(synth_root, validation__scheme=scheme, validation__fold=fold))
    manifest = open_manifest(cfg["dataset"])
    model = build_run_model(cfg)
    train_classes = np.unique(manifest.labels[manifest.indices("train")])
    assert len(train_classes) == 16
    tr_cls, va_cls = kfold_class_splits(train_classes, 4, scheme)[fold]
    assert len(tr_cls) and len(va_cls) and not set(tr_cls) & set(va_cls)

    train, test, labelmap = build_datasets(cfg["dataset"], manifest, model, cfg["validation"])
    val = build_validation(cfg["dataset"], cfg["validation"], manifest, model)
    assert np.array_equal(np.unique(train.labels), tr_cls)
    assert np.array_equal(np.unique(val.labels), va_cls)
    assert np.array_equal(np.sort(train.rows), np.sort(split_indices(manifest, "fold_train", fold, 4, scheme)))
    assert np.array_equal(np.sort(val.rows), np.sort(split_indices(manifest, "fold_val", fold, 4, scheme)))
    assert not set(train.rows.tolist()) & set(val.rows.tolist())
    # every image of a fold-training class is trained on
    train_rows = manifest.indices("train")
    assert len(train.rows) == int(np.isin(manifest.labels[train_rows], tr_cls).sum())
    # the test split is untouched
    assert np.array_equal(np.sort(test.rows), np.sort(manifest.indices("test")))
    assert not set(np.unique(test.labels)) & set(train_classes)
    # the loss: one proxy set per fold-training class
    assert len(labelmap) == len(tr_cls)
    loss = build_run_loss(cfg, len(labelmap), model.embedding_size)
    assert loss.num_classes == len(tr_cls)
    assert loss.proxies.shape == (len(tr_cls) * 2, 16)
    assert sorted(set(loss.proxy_labels.tolist())) == list(range(len(tr_cls)))


def capture_trainer(monkeypatch) -> dict:
    """A dict whose "t" is, after train_run, the engine's Trainer (its ``parts``: datasets, loss, regulariser)."""
    from dmlrepro.train import engine

    seen = {}
    original = engine.Trainer.__init__

    def spy(self, *a, **k):
        original(self, *a, **k)
        seen["t"] = self

    monkeypatch.setattr(engine.Trainer, "__init__", spy)
    return seen


@pytest.mark.slow
def test_engine_trains_on_fold_classes_only(synth_root, tmp_path, monkeypatch):
    """The engine's own datasets and loss (captured from a 1-epoch run), and the labels it trains on."""
    from dmlrepro.data.splits import kfold_class_splits

    seen = capture_trainer(monkeypatch)
    train_run(
        asap_config(synth_root, epochs=1, validation__scheme="mlrc", validation__fold=2), tmp_path / "r", progress=False
    )
    parts = seen["t"].parts
    classes = np.unique(parts.manifest.labels[parts.manifest.indices("train")])
    tr_cls, va_cls = kfold_class_splits(classes, 4, "mlrc")[2]
    assert np.array_equal(np.unique(parts.train_ds.labels), tr_cls)
    assert np.array_equal(np.unique(parts.validation.ds.labels), va_cls)
    assert parts.loss.num_classes == len(tr_cls) == len(parts.labelmap)
    # the sampler draws only fold-training images
    batches = [i for b in parts.sampler for i, _ in b]
    assert set(np.asarray(parts.train_ds.labels)[batches]) <= set(tr_cls)
    # the k-Center pools are embedded from fold-training images: their labels are 0..C_train-1
    assert set(parts.projections._labels().tolist()) == set(range(len(tr_cls)))


# -- 2. early stopping -------------------------------------------------------------------------------
def _expected_stop(values: list[float], patience: int, min_delta: float) -> tuple[int, int]:
    """(index of the last improvement, index of the stopping evaluation), both 1-based."""
    best, best_i = -math.inf, 0
    for i, v in enumerate(values, 1):
        if v > best + min_delta:
            best, best_i = v, i
        elif i - best_i >= patience:
            return best_i, i
    return best_i, 0


@pytest.mark.slow
def test_early_stopping_after_patience_evaluations(synth_root, tmp_path):
    patience, min_delta = 2, 0.01
    cfg = asap_config(
        synth_root,
        loss={"name": "pair_c2", "hparams": {"pos_margin": 0.0, "neg_margin": 0.3841}},
        asap={"enabled": False},
        optimizer={"name": "adam", "lr": 0.05},
        validation__patience=patience,
        validation__min_delta=min_delta,
        eval__select="last",
        epochs=20,
    )
    out = tmp_path / "run"
    m = train_run(cfg, out, progress=False)
    log = json.loads((out / "validation_log.json").read_text())
    values = [e["map_r"] for e in log["evaluations"]]
    best_i, stop_i = _expected_stop(values, patience, min_delta)
    assert stop_i, f"the run did not plateau within {cfg['epochs']} epochs: {values}"
    assert stop_i == best_i + patience
    assert len(values) == stop_i  # no evaluation after the stop
    assert [e["stop"] for e in log["evaluations"]] == [False] * (stop_i - 1) + [True]
    assert [e["step"] for e in log["evaluations"]] == [E * i for i in range(1, stop_i + 1)]
    assert m["stopped_epoch"] == stop_i and m["global_steps"] == E * stop_i
    assert m["epoch"] == stop_i  # select: last -> the stopped epoch's model
    assert m["validation"]["early_stopped"] is True and m["validation"]["evaluations"] == stop_i
    assert m["validation"]["best_step"] == E * best_i
    assert log["alternations"] == [] and len(log["projections"]) == 1
    assert log["projections"][0]["end_reason"] == "early_stop"
    with open(out / "train_log.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == list(range(1, stop_i + 1))
    assert [float(r["val_map@r"]) for r in rows] == pytest.approx(values, abs=0)
    assert list_checkpoints(out / "checkpoints")[-1].name == checkpoint_name(stop_i + 1, 0)


# -- 3. best_val selection ---------------------------------------------------------------------------
@pytest.mark.slow
def test_best_val_selects_and_embeds_the_best_validation_model(asap_run):
    from dmlrepro.evaluation.embeddings_io import load_embeddings
    from dmlrepro.train import compute_embeddings
    from dmlrepro.train.model_and_loss import build_run_model
    from dmlrepro.train.run_data import build_datasets, open_manifest

    cfg, out, m, log = asap_run
    values = [e["map_r"] for e in log["evaluations"]]
    best_i, _ = _expected_stop(values, 10**9, cfg["validation"]["min_delta"])
    assert [e["improved_global"] for e in log["evaluations"]].count(True) >= 1
    assert m["epoch"] == best_i  # one epoch per evaluation
    assert m["validation"]["best_step"] == E * best_i
    best = read_checkpoint(out / "checkpoints" / "best_val_model.pt")
    assert int(best["epoch"]) == best_i
    # the best-val model is the model as it was after that epoch (the epoch-end checkpoint)
    at = _ckpt_at_epoch_end(out, best_i)["model"]
    assert all(torch.equal(best["model"][k], at[k]) for k in at)
    # the saved test embeddings are those of the best-val model
    rc = resolve_run_config(cfg)
    model = build_run_model(rc)
    model.load_state_dict(best["model"])
    _, test_ds, _ = build_datasets(rc["dataset"], open_manifest(rc["dataset"]), model, rc["validation"])
    emb, labels, _ = compute_embeddings(model, test_ds, batch_size=512, device=torch.device("cpu"))
    saved = load_embeddings(out / "embeddings_test.npz")
    assert np.array_equal(saved.labels, labels)
    np.testing.assert_allclose(saved.embeddings, emb, rtol=0, atol=1e-6)
    assert int(saved.meta["epoch"]) == best_i
    # and not those of the final model (guards against a trivially equal comparison)
    last = list_checkpoints(out / "checkpoints")[-1]
    if best_i != read_checkpoint(last)["position"]["epoch"] - 1:
        model.load_state_dict(read_checkpoint(last)["model"])
        emb_last, _, _ = compute_embeddings(model, test_ds, batch_size=512, device=torch.device("cpu"))
        assert not np.allclose(emb_last, emb)


# -- 4. alternation rule -----------------------------------------------------------------------------
@pytest.mark.slow
def test_alternations_follow_projection_patience(asap_run):
    cfg, out, m, log = asap_run
    a, v = cfg["asap"], cfg["validation"]
    pp, lam, md = a["projection_patience"], a["lam"], v["min_delta"]
    evals = log["evaluations"]
    assert log["steps_per_evaluation"] == E
    assert len(log["alternations"]) >= 2, f"the shared run should alternate at least twice: {evals}"
    # replay the rule on the logged MAP@R values
    projection, best, bad, best_g, bad_g = 0, -math.inf, 0, -math.inf, 0
    alternation_steps = []
    for i, e in enumerate(evals, 1):
        assert e["step"] == E * i and e["projection"] == projection
        assert e["lambda_eff"] == (0.0 if projection == 0 else lam)  # ASAP-R3
        if e["map_r"] > best_g + md:
            best_g, bad_g = e["map_r"], 0
        else:
            bad_g += 1
        stop = bad_g >= v["patience"]
        if e["map_r"] > best + md:
            best, bad = e["map_r"], 0
        else:
            bad += 1
        alternate = not stop and bad >= pp
        assert e["improved_projection"] == (bad == 0)
        assert (e["alternate"], e["stop"]) == (alternate, stop), f"evaluation {i}: {e}"
        if alternate:
            alternation_steps.append(e["step"])
            projection, best, bad = projection + 1, -math.inf, 0
        if stop:
            assert i == len(evals)
    assert [x["step"] for x in log["alternations"]] == alternation_steps
    assert [x["epoch"] for x in log["alternations"]] == [s // E for s in alternation_steps]
    # projections: contiguous, multiples of E, those ended by an alternation last >= (pp + 1)·E
    projs = log["projections"]
    assert [p["projection"] for p in projs] == list(range(len(alternation_steps) + 1))
    assert projs[0]["start_step"] == 0 and projs[-1]["end_step"] == evals[-1]["step"]
    for p, q in zip(projs, projs[1:]):
        assert q["start_step"] == p["end_step"]
    for p in projs:
        assert p["steps"] % E == 0 and p["steps"] == p["end_step"] - p["start_step"]
        assert p["lambda_eff"] == (0.0 if p["projection"] == 0 else lam)
        if p["end_reason"] == "alternation":
            assert p["steps"] >= (pp + 1) * E
    assert projs[-1]["end_reason"] == ("early_stop" if m["stopped_epoch"] else "max_epochs")
    # the engine applied λ_eff: the regulariser's λ after each epoch (epoch-end checkpoints)
    for i, e in enumerate(evals, 1):
        reg = _ckpt_at_epoch_end(out, i)["projections"]["reg"]
        now = e["projection"] + (1 if e["alternate"] else 0)
        assert reg["lam"] == (0.0 if now == 0 else lam), f"epoch {i}"
    # validation embeddings of each projection's solution (Fig. 7; Fig. 7 needs those closed by an alternation)
    for p in projs:
        if p["end_reason"] in ("alternation", "early_stop"):
            assert (out / "projections" / f"projection-{p['projection']}_val.npz").is_file()


@pytest.mark.slow
def test_last_projection_val_embeddings_saved_when_epoch_cap_ends_run(asap_run):
    cfg, out, m, log = asap_run
    last = log["projections"][-1]
    assert last["end_reason"] == "max_epochs"
    assert (out / "projections" / f"projection-{last['projection']}_val.npz").is_file()


@pytest.mark.slow
def test_projection_val_embeddings_are_those_of_the_best_in_projection_model(asap_run):
    from dmlrepro.evaluation.embeddings_io import load_embeddings
    from dmlrepro.train import compute_embeddings
    from dmlrepro.train.model_and_loss import build_run_model
    from dmlrepro.train.run_data import build_validation, open_manifest

    cfg, out, m, log = asap_run
    rc = resolve_run_config(cfg)
    model = build_run_model(rc)
    val_ds = build_validation(rc["dataset"], rc["validation"], open_manifest(rc["dataset"]), model)
    for alt in log["alternations"]:
        model.load_state_dict(_ckpt_at_epoch_end(out, alt["anchor_step"] // E)["model"])
        emb, labels, rows = compute_embeddings(model, val_ds, batch_size=512, device=torch.device("cpu"))
        saved = load_embeddings(out / "projections" / f"projection-{alt['from_projection']}_val.npz")
        assert saved.split == "validation" and int(saved.meta["projection"]) == alt["from_projection"]
        assert np.array_equal(saved.labels, labels) and np.array_equal(saved.indices, rows)
        np.testing.assert_allclose(saved.embeddings, emb, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_alternation_resets_proxies_by_kcenter_and_keeps_optimizer(asap_run):
    """At an alternation the proxies are re-selected (they change discontinuously) and the
    optimiser's moments are kept (ASAP-R5 default)."""
    cfg, out, m, log = asap_run
    step = log["alternations"][0]["step"]
    epoch = step // E
    before, after = _ckpt_at_epoch_end(out, epoch - 1), _ckpt_at_epoch_end(out, epoch)
    assert after["optimizer"]["state"], "optimizer state was cleared (ASAP-R5 default keeps it)"
    assert before["projections"]["selections"] == 1 and after["projections"]["selections"] == 2


# -- 5. proximal anchor = best-in-projection weights ---------------------------------------------------
@pytest.mark.slow
def test_proximal_anchor_is_best_in_projection_weights(asap_run):
    cfg, out, m, log = asap_run
    names = _trainable_names(cfg)
    final = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    last_alt = log["alternations"][-1]
    closed = [p for p in log["projections"] if p["projection"] == last_alt["from_projection"]][0]
    assert last_alt["anchor_step"] == closed["best_step"] and closed["best_step"] % E == 0
    at_best = _ckpt_at_epoch_end(out, closed["best_step"] // E)["model"]
    anchor = final["projections"]["reg"]["anchor"]
    assert len(anchor) == len(names)
    for n, a in zip(names, anchor):
        assert torch.equal(a, at_best[n]), f"anchor {n} is not θ at the projection's best evaluation"
    # ... and not the weights at the alternation itself (the test would be vacuous otherwise)
    at_alt = _ckpt_at_epoch_end(out, last_alt["step"] // E)["model"]
    assert any(not torch.equal(a, at_alt[n]) for n, a in zip(names, anchor))
    # the open projection's best snapshot (θ_bp, ρ_bp) is the model and proxies at its best evaluation
    open_p = [e for e in log["evaluations"] if e["projection"] == last_alt["to_projection"]]
    best_step = max((e for e in open_p if e["improved_projection"]), key=lambda e: e["step"])["step"]
    ck = _ckpt_at_epoch_end(out, best_step // E)
    bm = final["projections"]["best_model"]
    assert all(torch.equal(bm[k], ck["model"][k]) for k in ck["model"])
    assert torch.equal(final["projections"]["best_proxies"], ck["loss"]["proxies"])


@pytest.mark.slow
def test_anchor_matches_a_run_cut_at_the_best_epoch(asap_run, tmp_path):
    """Same run cut (epochs) at the best evaluation of the first projection: its final weights
    are the anchor set at the first alternation."""
    cfg, out, m, log = asap_run
    first = log["alternations"][0]
    best_epoch = first["anchor_step"] // E
    cut = train_run({**copy.deepcopy(cfg), "epochs": best_epoch}, tmp_path / "cut", progress=False)
    assert cut["status"] == "completed"
    cut_model = read_checkpoint(tmp_path / "cut" / "checkpoints" / checkpoint_name(best_epoch + 1, 0))["model"]
    anchor = _ckpt_at_epoch_end(out, first["step"] // E)["projections"]["reg"]["anchor"]
    for n, a in zip(_trainable_names(cfg), anchor):
        assert torch.equal(a, cut_model[n]), n


@pytest.mark.slow
def test_proxies_are_never_regularised(synth_root, tmp_path, monkeypatch):
    seen = capture_trainer(monkeypatch)
    train_run(asap_config(synth_root, epochs=1), tmp_path / "r", progress=False)
    parts = seen["t"].parts
    reg = parts.projections.reg
    ids = {id(p) for p in reg.params}
    assert id(parts.loss.proxies) not in ids
    assert not ids & {id(p) for p in parts.loss.parameters()}
    assert ids == {id(p) for p in parts.model.parameters() if p.requires_grad}
    assert all(a.shape != parts.loss.proxies.shape or a.data_ptr() != parts.loss.proxies.data_ptr() for a in reg.anchor)


# -- 6. resume bit for bit -----------------------------------------------------------------------------
def _write_config(path, cfg) -> str:
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _final(outdir) -> dict:
    return read_checkpoint(list_checkpoints(outdir / "checkpoints")[-1])


def _assert_same_run(ref, run):
    a, b = _final(ref), _final(run)
    assert a["position"]["global_step"] == b["position"]["global_step"]
    for part in ("model", "loss"):
        assert not state_differences(a[part], b[part]), part
    pa, pb = a["projections"], b["projections"]
    assert pa["selections"] == pb["selections"] and pa["reg"]["lam"] == pb["reg"]["lam"]
    assert all(torch.equal(x, y) for x, y in zip(pa["reg"]["anchor"], pb["reg"]["anchor"]))
    assert torch.equal(pa["best_proxies"], pb["best_proxies"])
    ba, bb = (read_checkpoint(d / "checkpoints" / "best_val_model.pt") for d in (ref, run))
    assert ba["epoch"] == bb["epoch"] and all(torch.equal(ba["model"][k], bb["model"][k]) for k in ba["model"])
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (ref, run))
    assert ma == mb
    va, vb = (json.loads((d / "validation_log.json").read_text()) for d in (ref, run))
    for alt in [*va["alternations"], *vb["alternations"]]:
        alt.pop("kcenter_seconds")  # wall time
    for sel in [*va["initial_selection"], *vb["initial_selection"]]:
        sel.pop("kcenter_seconds")
    assert va == vb
    ea, eb = (np.load(d / "embeddings_test.npz") for d in (ref, run))
    assert np.array_equal(ea["embeddings"], eb["embeddings"])
    for p in sorted((ref / "projections").glob("*.npz")):
        assert np.array_equal(np.load(p)["embeddings"], np.load(run / "projections" / p.name)["embeddings"])


@pytest.mark.slow
def test_interrupted_asap_run_resumes_bit_for_bit(synth_root, tmp_path):
    cfg = asap_config(synth_root, epochs=10, asap__projection_patience=1, checkpoint={"keep": 2})
    conf = _write_config(tmp_path / "run.yaml", cfg)
    ref = tmp_path / "ref"  # the uninterrupted reference, in this process (threads: 1, deterministic)
    train_run(cfg, ref, progress=False)
    log = json.loads((ref / "validation_log.json").read_text())
    assert len(log["alternations"]) >= 2, log["evaluations"]
    first, second = log["alternations"][0]["step"], log["alternations"][1]["step"]
    out = tmp_path / "run"
    # 1) SIGTERM mid-epoch 2 (projection 0): mid-epoch checkpoint
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_SIGNAL_AFTER_STEPS": "4"})
    assert r.returncode == EXIT_INTERRUPTED, r.stderr
    done = 4
    # 2) SIGTERM right after the last step of the first alternation's epoch: the checkpoint is
    #    written before that epoch's validation, so the resumed process validates and alternates
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_SIGNAL_AFTER_STEPS": str(first - done)})
    assert r.returncode == EXIT_INTERRUPTED, r.stderr
    state = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    assert state["position"]["global_step"] == first and state["projections"]["selections"] == 1
    done = first
    # 3) SIGKILL one step into the epoch after the second alternation: resumes from the
    #    epoch-end checkpoint written just after that alternation
    kill = second + 1 - done
    r = run_cli(["train", conf, str(out), "--no-progress"], {"DMLREPRO_TEST_KILL_AFTER_STEPS": str(kill)})
    assert r.returncode == -signal.SIGKILL
    state = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    assert state["position"]["global_step"] == second and state["projections"]["selections"] == 3
    assert state["validation"]["schedule"]["projection"] == 2
    # 4) finish
    r = run_cli(["train", conf, str(out), "--no-progress"])
    assert r.returncode == 0, r.stderr
    assert "resuming from " + checkpoint_name(second // E + 1, 0) in r.stdout
    _assert_same_run(ref, out)


# -- 7. config errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(loss={"name": "proxy_anchor", "hparams": {}}), "asap.enabled"),
        (dict(loss={"name": "pair_c2", "hparams": {}}), "asap.enabled"),
        (dict(validation={"split": None}, eval__select="last"), "asap.enabled"),
        (dict(validation={"split": None}, asap={"enabled": False}), "eval.select"),
        (dict(validation__fold=4), "validation.fold"),
        (dict(validation__fold=5, validation__n_folds=5), "validation.fold"),
        (dict(validation__split="kfold"), "validation.split"),
        (dict(validation__scheme="random"), "validation.scheme"),
        (dict(asap__anchor="mean"), "asap.anchor"),
        (dict(asap__projection_patience=0), "asap.projection_patience"),
        (dict(eval__select="best_test"), "eval.select"),
        (
            dict(validation={"split": None, "patience": 3}, asap={"enabled": False}, eval__select="last"),
            "validation.patience",
        ),
    ],
)
def test_config_errors_name_the_key(tmp_path, overrides, key):
    cfg = asap_config(tmp_path, **overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve_run_config(cfg)


def test_valid_fold_is_accepted(tmp_path):
    cfg = resolve_run_config(asap_config(tmp_path, validation__fold=3))
    assert cfg["validation"]["fold"] == 3 and cfg["eval"]["select"] == "best_val"


# -- 8. identity ------------------------------------------------------------------------------------------
def test_run_identity_unchanged_without_validation_or_asap(tmp_path):
    from dmlrepro.runs import config_hash
    from dmlrepro.train.config import LATE_DEFAULTS, config_identity, without_late_defaults

    plain = asap_config(tmp_path, loss={"name": "proxy_anchor", "hparams": {}})
    for k in ("validation", "asap", "checkpoint"):
        plain.pop(k)
    plain["eval"] = {"select": "last"}
    resolved = resolve_run_config(plain)
    assert "validation" in resolved and "asap" in resolved
    ident = config_identity(resolved)
    assert "validation" not in ident and "asap" not in ident
    assert "validation" not in without_late_defaults(resolved) and "asap" not in without_late_defaults(resolved)
    assert "validation" not in config_identity(resolved) and "asap" not in config_identity(resolved)
    # the hash of the config as it resolved before the keys existed
    old = copy.deepcopy(resolved)
    old.pop("validation"), old.pop("asap")
    assert config_hash(resolved) == config_hash(old)
    # explicit defaults are the same run
    explicit = copy.deepcopy(plain)
    explicit["validation"] = dict(LATE_DEFAULTS[(None, "validation")])
    explicit["asap"] = {"enabled": False}
    assert config_hash(resolve_run_config(explicit)) == config_hash(resolved)
    # a validation split is another run, and so is any ASAP setting
    split = resolve_run_config({**copy.deepcopy(plain), "validation": {"split": "fold"}})
    assert config_hash(split) != config_hash(resolved)
    assert "validation" in config_identity(split)
    fold2 = resolve_run_config({**copy.deepcopy(plain), "validation": {"split": "fold", "fold": 2}})
    assert config_hash(fold2) != config_hash(split)
    b = resolve_run_config({**copy.deepcopy(plain), "asap": {"b": 5}})
    assert config_hash(b) != config_hash(resolved)


def test_asap_proxies_are_proxy_points_in_their_normalised_space():
    """eval.proxy_metrics (W2, AvgDTP) see ASAP's proxies after 𝒩(v) = v / max(1, ‖v‖), one label per row c·P + k."""
    from dmlrepro.losses import build_loss, proxy_points

    loss = build_loss("asap_c2", 3, 4, proxies_per_class=2)
    loss.set_proxies(torch.tensor([[3.0, 0, 0, 0], [0.5, 0, 0, 0]]).repeat(3, 1))
    points, labels = proxy_points(loss)
    assert labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert torch.allclose(points[0], torch.tensor([1.0, 0, 0, 0])) and torch.allclose(
        points[1], torch.tensor([0.5, 0, 0, 0])
    )
