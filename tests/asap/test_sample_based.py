"""Sample-based ASAP (paper eq. 4.10, §5.2; ASAP-R28): ``asap.proxies: samples``.

The k-Center-selected samples stand in for the proxies: at every step the loss's proxies are the
current network's embeddings of those samples (eval transform, in the batch's train-mode forward
pass), so gradients reach θ through them and the loss has no trainable proxy parameter. The picks
change only at an alternation, by the same greedy k-Center as proxy-based ASAP. Float64 references
from ``asap_reference`` (double loops, nothing from dmlrepro).

(The batch uses RandomResizedCrop: with an identical batch image and anchor image the pair distance
is 0, which C2 clamps to 1e-6 and counts as one non-zero positive term; the double loop does not.)

One small engine run on a synthetic dataset (16 classes × 8 images; fold 1 of 4 → 6 training
classes; P = 2, b = 4; 3 steps per evaluation; pool_augment off, so the k-Center pools are
deterministic and can be recomputed here) is shared by the engine tests.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from dmlrepro.asap import sample_pools
from dmlrepro.losses import build_loss
from dmlrepro.train import list_checkpoints, read_checkpoint, resolve_run_config, train_run
from dmlrepro.train.checkpoint import checkpoint_name

import asap_reference as ref

E = 3
SYNTH = {"num_classes": 16, "images_per_class": 8, "size": 32}
M_POS, M_NEG = 0.0, 0.3841


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory):
    from dmlrepro.data import prepare

    root = tmp_path_factory.mktemp("synth-samples")
    prepare("synthetic", root, progress=False, **SYNTH)
    return root


def sample_config(root, proxies="samples", **asap) -> dict:
    return {
        "dataset": {
            "name": "synthetic",
            "root": str(root),
            "params": dict(SYNTH),
            "sampler": "m_per_class",
            "m": 4,
            "batch_size": 16,
            "image_size": 32,
            "resize": 32,
            "train_crop": "rrc",
            "eval_batch_size": 512,
        },
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [8, 16, 16], "strides": [2, 2, 2]},
            "embedding_size": 8,
            "l2_normalize": False,
        },
        "loss": {"name": "asap_c2", "hparams": {"proxies_per_class": 2, "pos_margin": M_POS, "neg_margin": M_NEG}},
        "optimizer": {"name": "adam", "lr": 3e-3, "weight_decay": 1e-4},
        "validation": {"split": "fold", "fold": 1, "n_folds": 4, "patience": 8, "min_delta": 1e-3},
        "asap": {
            "enabled": True,
            "b": 4,
            "lam": 2e-4,
            "projection_patience": 1,
            "pool_augment": False,
            "proxies": proxies,
            **asap,
        },
        "eval": {"select": "best_val", "every": 0, "before_training": False},
        "checkpoint": {"keep": 100},
        "steps_per_epoch": E,
        "epochs": 8,
        "seed": 0,
        "threads": 1,
        "device": "cpu",
    }


@pytest.fixture(scope="module")
def sample_run(synth_root, tmp_path_factory):
    """The run, with each optimizer step's inputs, θ before it, the engine's loss value and gradients,
    and the trainer's parts (``Trainer.parts``: datasets, loss, optimizer, projections)."""
    from dmlrepro.train import engine

    cfg = sample_config(synth_root)
    out = tmp_path_factory.mktemp("samples") / "run"
    steps, seen = [], {}
    orig_init, orig_step = engine.Trainer.__init__, engine.Trainer.step

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        seen["t"] = self

    def step(self, x, y):
        before = copy.deepcopy(self.parts.model.state_dict())
        loss_before = float(self.parts.stepper._loss_sum)  # the epoch's loss sum, kept on the device between host syncs
        indices = self.parts.projections.indices.clone()
        what = orig_step(self, x, y)
        steps.append(
            {
                "x": x.clone(),
                "y": self.parts.labelmap(y.clone()),
                "theta": before,
                "indices": indices,
                "value": float(self.parts.stepper._loss_sum) - loss_before,
                "what": what,
                "global_step": self.state.global_step,
                "grads": {n: p.grad.clone() for n, p in self.parts.model.named_parameters() if p.grad is not None},
                "lam": self.parts.projections.reg.lam,
            }
        )
        return what

    mp = pytest.MonkeyPatch()
    mp.setattr(engine.Trainer, "__init__", init)
    mp.setattr(engine.Trainer, "step", step)
    try:
        metrics = train_run(cfg, out, progress=False)
    finally:
        mp.undo()
    assert metrics["status"] == "completed"
    log = json.loads((out / "validation_log.json").read_text())
    assert log["alternations"], "the shared run needs an alternation"
    return cfg, out, log, steps, seen["t"].parts


def _train_eval(parts):
    """The training images with the eval transform, built here from the run config."""
    from dmlrepro.train.model_and_loss import build_run_model
    from dmlrepro.train.run_data import build_train_eval, open_manifest

    cfg = parts.cfg
    return build_train_eval(cfg["dataset"], open_manifest(cfg["dataset"]), build_run_model(cfg), parts.train_ds.rows)


def _model64(cfg, state):
    from dmlrepro.train.model_and_loss import build_run_model

    model = build_run_model(resolve_run_config(cfg)).double()
    model.load_state_dict(state)
    return model


def _reference_loss(model, x, y, anchor_x, P, num_classes):
    """C2 of eq. 4.11 with ρ = f(anchor samples; θ), float64 double loop; one train-mode pass of
    [batch; anchors] (the engine's reading)."""
    model.train()
    out = model(torch.cat([x, anchor_x]).double())
    emb, z = out[: len(x)], out[len(x) :]
    e = torch.stack([ref.lip(v) for v in emb])
    r = torch.stack([ref.lip(v) for v in z])
    r_lab = torch.arange(num_classes).repeat_interleave(P)
    return ref.c2(e, y, r, r_lab, M_POS, M_NEG)


# -- 1. the loss at a step = C2 with proxies = current embeddings of the selected samples --------------
@pytest.mark.slow
def test_step_loss_is_c2_with_current_embeddings_of_selected_samples(sample_run):
    cfg, out, log, steps, parts = sample_run
    ds = _train_eval(parts)
    C, P = parts.loss.num_classes, parts.loss.proxies_per_class
    first_alt = log["alternations"][0]["step"]
    # the first step, the last one before the first alternation and the first one after it
    for s in (steps[0], steps[first_alt - 1], steps[first_alt]):
        assert s["what"] is None
        anchor_x = torch.stack([ds[int(i)][0] for i in s["indices"].flatten()])
        model = _model64(cfg, s["theta"])
        value = _reference_loss(model, s["x"], s["y"], anchor_x, P, C)
        assert float(value) == pytest.approx(s["value"], rel=1e-5, abs=1e-6), s["global_step"]
        assert float(value) > 0


# -- 2. gradients through the anchors; no trainable proxy parameter -----------------------------------
@pytest.mark.slow
def test_no_trainable_proxy_parameter(sample_run):
    cfg, out, log, steps, parts = sample_run
    assert parts.loss.sample_based and list(parts.loss.parameters()) == []
    assert "proxies" in dict(parts.loss.named_buffers()) and "proxies" in parts.loss.state_dict()
    assert "loss" not in [g["name"] for g in parts.optimizer.param_groups]
    ids = {id(p) for p in parts.projections.reg.params}
    assert ids == {id(p) for p in parts.model.parameters() if p.requires_grad}
    # the checkpointed proxy values are a record of the anchors' embeddings, the picks are checkpointed
    final = read_checkpoint(list_checkpoints(out / "checkpoints")[-1])
    assert final["loss"]["proxies"].shape == (parts.loss.num_classes * parts.loss.proxies_per_class, 8)
    assert torch.equal(final["projections"]["indices"], parts.projections.indices)


@pytest.mark.slow
def test_engine_gradients_flow_through_anchor_embeddings(sample_run):
    """The engine's gradients at step 1 (λ_eff = 0, ASAP-R3) equal float64 autograd of the reference loss
    through batch *and* anchor embeddings, and differ from those with the anchors detached."""
    cfg, out, log, steps, parts = sample_run
    ds = _train_eval(parts)
    s = steps[0]
    assert s["lam"] == 0.0
    C, P = parts.loss.num_classes, parts.loss.proxies_per_class
    anchor_x = torch.stack([ds[int(i)][0] for i in s["indices"].flatten()])
    model = _model64(cfg, s["theta"])
    _reference_loss(model, s["x"], s["y"], anchor_x, P, C).backward()
    full = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n, g in s["grads"].items():
        torch.testing.assert_close(g.double(), full[n], rtol=1e-4, atol=1e-6, msg=n)
    # the same loss with the anchors' embeddings detached: another gradient (the anchor path matters)
    model = _model64(cfg, s["theta"])
    model.train()
    o = model(torch.cat([s["x"], anchor_x]).double())
    emb, z = o[: len(s["x"])], o[len(s["x"]) :].detach()
    r_lab = torch.arange(C).repeat_interleave(P)
    ref.c2(
        torch.stack([ref.lip(v) for v in emb]), s["y"], torch.stack([ref.lip(v) for v in z]), r_lab, M_POS, M_NEG
    ).backward()
    diff = max(float((p.grad - full[n]).abs().max()) for n, p in model.named_parameters())
    assert diff > 1e-6


def test_loss_forward_with_given_proxies_matches_reference_and_backpropagates():
    """ASAPLoss(proxies=z): value and gradients w.r.t. the batch and z equal the float64 double loop."""
    torch.manual_seed(0)
    C, P, D = 3, 2, 4
    loss = build_loss("asap_c2", C, D, proxies_per_class=P, pos_margin=M_POS, neg_margin=M_NEG).double()
    loss.use_sample_proxies()
    assert loss.sample_based and list(loss.parameters()) == [] and not loss.proxies.requires_grad
    loss.use_sample_proxies()  # idempotent
    emb = (torch.randn(7, D, dtype=torch.float64) * 0.6).requires_grad_()
    z = (torch.randn(C * P, D, dtype=torch.float64) * 0.6).requires_grad_()
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0])
    got = loss(emb, y, proxies=z)
    got.backward()
    e2, z2 = emb.detach().clone().requires_grad_(), z.detach().clone().requires_grad_()
    want = ref.c2(
        [ref.lip(v) for v in e2], y, [ref.lip(v) for v in z2], torch.arange(C).repeat_interleave(P), M_POS, M_NEG
    )
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(emb.grad, e2.grad)
    torch.testing.assert_close(z.grad, z2.grad)
    assert z.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="shape"):
        loss(emb, y, proxies=z[:-1])


# -- 3. the picks change exactly at an alternation, by k-Center as proxy-based ASAP -----------------
@pytest.mark.slow
def test_selected_samples_change_exactly_at_alternations(sample_run):
    cfg, out, log, steps, parts = sample_run
    alt_steps = {a["step"] for a in log["alternations"]}
    prev = torch.tensor(log["initial_selection"][0]["samples"])
    assert torch.equal(steps[0]["indices"], prev)
    for s in steps:  # global_step = steps done before this one; an alternation after step k acts from k + 1
        changed = not torch.equal(s["indices"], prev)
        assert changed == (s["global_step"] in alt_steps), s["global_step"]
        prev = s["indices"]
    for a in log["alternations"]:
        after = [s for s in steps if s["global_step"] == a["step"]]
        if after:
            assert after[0]["indices"].tolist() == a["samples"]
        assert np.array_equal(np.asarray(parts.train_ds.rows)[np.asarray(a["samples"])], np.asarray(a["sample_rows"]))
        # the same classes: row c of the picks holds P samples of class c
        labels = parts.projections._labels().numpy()
        assert all(set(labels[np.asarray(r)].tolist()) == {c} for c, r in enumerate(a["samples"]))


@pytest.mark.slow
def test_alternation_picks_are_kcenter_seeded_with_the_samples_at_theta_star(sample_run):
    """Recomputed here: pool = the same seeded draw, f(·; θ*) in float64 (BN inference mode, eval
    transform as pool_augment is off), seeds = the previous picks embedded at θ*, brute-force Alg. 2."""
    from dmlrepro.train.projections import _seed

    cfg, out, log, steps, parts = sample_run
    ds = _train_eval(parts)
    labels = parts.projections._labels()
    C, P, b = parts.loss.num_classes, parts.loss.proxies_per_class, cfg["asap"]["b"]
    prev = torch.tensor(log["initial_selection"][0]["samples"])
    for k, alt in enumerate(log["alternations"], start=1):
        theta_star = read_checkpoint(out / "checkpoints" / checkpoint_name(alt["anchor_step"] // E + 1, 0))["model"]
        model = _model64(cfg, theta_star).eval()
        g = torch.Generator()
        g.manual_seed(_seed(cfg["seed"], k) ^ 0x5A)
        pool = sample_pools(labels, C, b, g)  # b >= P: pool of b per class

        def embed(idx):
            with torch.no_grad():
                return model(torch.stack([ds[int(i)][0] for i in idx]).double())  # noqa: B023 (called in this iteration)

        picks = []
        for c in range(C):
            pe = embed(pool[c])
            seeds = embed(prev[c])
            picks.append([int(pool[c][j]) for j in ref.farthest_first(list(pe), P, list(seeds))])
        assert picks == alt["samples"], k
        prev = torch.tensor(alt["samples"])


# -- 4. default off: run ids and behaviour unchanged ---------------------------------------------------
def test_default_is_trainable_and_leaves_run_ids_unchanged(synth_root):
    from dmlrepro.runs import config_hash
    from dmlrepro.train.config import DEFAULTS, config_identity, without_late_defaults

    assert DEFAULTS["asap"]["proxies"] == "trainable"
    cfg = sample_config(synth_root, proxies="trainable")
    resolved = resolve_run_config(cfg)
    implicit = copy.deepcopy(cfg)
    implicit["asap"].pop("proxies")
    assert config_hash(resolve_run_config(implicit)) == config_hash(resolved)
    # the resolution before the key existed (a finished run's config.yaml): same hash, same identity
    old = copy.deepcopy(resolved)
    old["asap"].pop("proxies")
    assert config_hash(old) == config_hash(resolved)
    assert "proxies" not in config_identity(resolved)["asap"]
    assert config_identity(old) == config_identity(resolved)
    # a run without ASAP: no asap section in its identity, from an old or a new config
    plain = resolve_run_config(
        {
            **copy.deepcopy(cfg),
            "asap": {"enabled": False},
            "validation": {"split": None},
            "eval": {"select": "last", "every": 0, "before_training": False},
        }
    )
    old_plain = copy.deepcopy(plain)
    old_plain["asap"].pop("proxies")
    assert "asap" not in without_late_defaults(plain) and "asap" not in without_late_defaults(old_plain)
    assert config_hash(plain) == config_hash(old_plain)
    # sample-based is another run
    assert config_hash(resolve_run_config(sample_config(synth_root))) != config_hash(resolved)
    assert config_identity(resolve_run_config(sample_config(synth_root)))["asap"]["proxies"] == "samples"


def test_bad_proxies_value_names_the_key(synth_root):
    from dmlrepro.train import ConfigError

    with pytest.raises(ConfigError, match="asap.proxies"):
        resolve_run_config(sample_config(synth_root, proxies="sample"))


@pytest.mark.slow
def test_trainable_default_keeps_a_proxy_parameter_and_plain_forward(synth_root, tmp_path, monkeypatch):
    """Proxy-based ASAP as before: the proxies are the loss's trainable parameter in the optimizer,
    the engine's forward is the batch alone, no picks are logged."""
    from dmlrepro.train import engine

    seen, calls = {}, []
    orig, orig_step = engine.Trainer.__init__, engine.Trainer.step

    def init(self, *a, **k):
        orig(self, *a, **k)
        seen["t"] = self

    def step(self, x, y):  # the sizes of the model's forward passes inside a training step
        fwd = self.parts.model.forward
        self.parts.model.forward = lambda inp: calls.append(len(inp)) or fwd(inp)
        try:
            return orig_step(self, x, y)
        finally:
            del self.parts.model.forward

    monkeypatch.setattr(engine.Trainer, "__init__", init)
    monkeypatch.setattr(engine.Trainer, "step", step)
    train_run(sample_config(synth_root, proxies="trainable") | {"epochs": 1}, tmp_path / "r", progress=False)
    parts = seen["t"].parts
    assert not parts.loss.sample_based and isinstance(parts.loss.proxies, torch.nn.Parameter)
    assert [p is parts.loss.proxies for p in parts.optimizer.param_groups[-1]["params"]] == [True]
    assert not parts.projections.samples and "indices" not in parts.projections.state_dict()
    log = json.loads((tmp_path / "r" / "validation_log.json").read_text())
    assert "samples" not in log["initial_selection"][0]
    assert calls == [16] * E  # one forward pass per step, of the batch alone


@pytest.mark.slow
def test_resumed_sample_based_run_is_identical(sample_run, tmp_path):
    """Cut the shared run back to the checkpoint after its first alternation and train on: the picks
    (checkpointed indices, anchor images re-loaded) and the final weights are those of the full run."""
    import shutil

    cfg, out, log, steps, parts = sample_run
    run = tmp_path / "run"
    shutil.copytree(out, run)
    epoch = log["alternations"][0]["step"] // E + 1  # the checkpoint after the epoch past the alternation
    keep = checkpoint_name(epoch + 1, 0)
    cut = [f for f in list_checkpoints(run / "checkpoints") if f.name > keep]
    assert cut and (run / "checkpoints" / keep).is_file()
    for f in cut:
        f.unlink()
    for name in ("metrics.json", "embeddings_test.npz"):
        (run / name).unlink(missing_ok=True)
    train_run(cfg, run, progress=False)
    a, b = (read_checkpoint(list_checkpoints(d / "checkpoints")[-1]) for d in (out, run))
    assert a["position"]["global_step"] == b["position"]["global_step"]
    assert torch.equal(a["projections"]["indices"], b["projections"]["indices"])
    for part in ("model", "loss"):
        for k in a[part]:
            assert torch.equal(a[part][k], b[part][k]), f"{part}.{k}"
    assert json.loads((out / "metrics.json").read_text()) == json.loads((run / "metrics.json").read_text())
