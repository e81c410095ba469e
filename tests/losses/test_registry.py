"""One place per loss (dmlrepro.losses.registry): what each loss declares reaches the config check, the
proxy metrics, final_proxies.npz, the optimizer's groups and the model presets, and the torch-free copy
the config check reads equals the declarations. The recipe of docs/losses.md ("Adding a loss") is carried
out here with a toy proxy loss that exists in this file only."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from dmlrepro import config_names
from dmlrepro.losses import Paper, Proxies, build_loss, proxy_points, register_loss
from dmlrepro.losses.catalog import CATALOG_FILE, catalog_source
from dmlrepro.losses.registry import REGISTRY, catalog
from dmlrepro.train.config import ConfigError, resolve_run_config

# Written from the papers, never read from the registry: the losses that learn one or more points per
# class (PFML §3, CPML supp. §1, RSW eq. 8, ASAP eq. 4.11, Proxy-Anchor, ProxyNCA as PML writes it and as
# published, SoftTriple's centres, and the class weights of normalised softmax, ArcFace and CosFace).
PROXY_LOSSES = {
    "pfml",
    "cpml",
    "rsw",
    "asap_c1",
    "asap_c2",
    "asap_ms",
    "asap_triplet",
    "proxy_anchor",
    "proxy_nca",
    "proxy_nca_paper",
    "soft_triple",
    "normalized_softmax",
    "arcface",
    "cosface",
}
# ASAP Alg. 1 sets the proxies (k-Center picks); eq. 4.10 replaces them by embedded samples
ASAP_PROXY_LOSSES = {"asap_c1", "asap_c2", "asap_ms", "asap_triplet"}
# filled into loss.hparams when missing: RSW's official code, CUB phase 1 (docs/paper-config.md, RSW-R3);
# PFML/CPML two proxies per class (docs/training.md's loss.hparams)
CONFIG_DEFAULTS = {
    "pfml": {"proxies_per_class": 2},
    "cpml": {"proxies_per_class": 2},
    "rsw": {"alpha": 28.4, "k1": 0.93, "k2": 1.15},
}


def test_the_generated_catalog_is_the_declarations():
    assert CATALOG_FILE.read_text(encoding="utf-8") == catalog_source(), "run python -m dmlrepro.losses.catalog --write"


def test_the_config_check_reads_the_catalog_without_torch():
    script = (
        "import json, sys\nfrom dmlrepro.config_names import LOSS_NAMES, loss_catalog\n"
        "from dmlrepro.report.readings import PAGES\n"
        "assert 'torch' not in sys.modules\n"
        "print(json.dumps({'names': list(LOSS_NAMES), 'catalog': loss_catalog(), 'pages': PAGES}))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout)
    losses, papers = catalog()
    assert seen["names"] == sorted(REGISTRY)
    assert seen["catalog"] == json.loads(json.dumps([losses, papers]))
    assert seen["pages"] == {"asap": "asap.md", "pfml": "pfml.md", "rsw": "rsw.md", "proto": "protocols.md"}


def test_each_loss_declares_its_proxies_and_config_defaults():
    losses, _ = catalog()
    assert {name for name, loss in losses.items() if loss["has_proxies"]} == PROXY_LOSSES
    assert {name for name, loss in losses.items() if loss["sets_proxies"]} == ASAP_PROXY_LOSSES
    assert {name for name, loss in losses.items() if loss["sample_proxies"]} == ASAP_PROXY_LOSSES
    filled = {name: loss["config_defaults"] for name, loss in losses.items() if loss["config_defaults"]}
    assert filled == CONFIG_DEFAULTS
    assert {name for name, loss in losses.items() if REGISTRY[name].lr_groups} == {"hist"}  # HIST's HGNN


def test_the_config_keys_doc_names_every_declared_default():
    """docs/training.md's loss.hparams row (config_keys) says in words what each loss fills in."""
    from dmlrepro.train.config_keys import KEYS_BY_NAME

    doc = KEYS_BY_NAME["loss.hparams"].doc
    for name, loss in catalog()[0].items():
        for key, value in loss["config_defaults"].items():
            assert f"`{name}`" in doc and f"{key}: {value}" in doc, (name, key)


def test_every_proxy_loss_gets_proxy_points_and_no_other():
    for name in sorted(REGISTRY):
        loss = build_loss(name, 3, 4, **CONFIG_DEFAULTS.get(name, {}))
        if name in PROXY_LOSSES:
            points, labels = proxy_points(loss)
            assert points.shape[1] == 4 and len(labels) == len(points) and set(labels.tolist()) == {0, 1, 2}, name
        else:
            with pytest.raises(ValueError, match="has no proxies"):
                proxy_points(loss)


# -- the recipe, with a loss of this file only ------------------------------------------------------------
TOY_PAPER = Paper("toy_paper", "a test-only paper", preset={"pool": "avg", "head": "linear", "l2_normalize": True})


class ToyProxyLoss(nn.Module):
    """Squared distance to the nearest own-class centre (K per class, kept in `centres`, ℓ2-normalised
    in the distances), times a learnt scale trained at half the head's lr."""

    def __init__(self, num_classes: int, embedding_size: int, margin: float, per_class: int = 2):
        super().__init__()
        self.margin, self.per_class = margin, per_class
        self.centres = nn.Parameter(torch.randn(num_classes * per_class, embedding_size))
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        centres = nn.functional.normalize(self.centres, dim=-1).view(-1, self.per_class, embeddings.shape[1])
        nearest = (embeddings[:, None, :] - centres[labels]).pow(2).sum(-1).min(dim=1).values
        return self.scale * (nearest + self.margin).mean()


@pytest.fixture
def toy():
    """The toy declared the way a loss module declares itself; withdrawn after the test."""
    register_loss(
        "toy_proxy",
        paper=TOY_PAPER,
        proxies=Proxies(
            tensor=lambda loss: loss.centres,
            per_class=lambda loss: loss.per_class,
            space=lambda points, loss: nn.functional.normalize(points, dim=-1),
        ),
        lr_groups=lambda loss: {"scale": ([loss.scale], "head", 0.5)},
        config_defaults={"margin": 0.25},
    )(ToyProxyLoss)
    yield ToyProxyLoss
    REGISTRY.pop("toy_proxy")


def _toy_config(**loss) -> dict:
    return {
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [8, 8], "strides": [2, 2]},
            "embedding_size": 4,
        },
        "loss": {"name": "toy_proxy", **loss},
        "optimizer": {"name": "sgd", "lr": 0.1},
    }


def test_the_toy_is_unknown_until_declared():
    with pytest.raises(ConfigError, match="loss.name"):
        resolve_run_config(_toy_config())


def test_the_toy_gets_the_config_check(toy):
    assert "toy_proxy" in config_names.LOSS_NAMES
    assert resolve_run_config(_toy_config())["loss"]["hparams"] == {"margin": 0.25}  # its declared default
    assert resolve_run_config(_toy_config(hparams={"margin": 1.0}))["loss"]["hparams"] == {"margin": 1.0}
    with pytest.raises(ConfigError, match="loss.hparams.margin"):  # annotated float: a number
        resolve_run_config(_toy_config(hparams={"margin": "wide"}))
    with pytest.raises(ConfigError, match="bad hyperparameters"):
        resolve_run_config(_toy_config(hparams={"margn": 1.0}))
    with pytest.raises(ConfigError, match="asap.enabled"):  # its proxies are not ASAP's to set
        resolve_run_config({**_toy_config(), "asap": {"enabled": True}, "validation": {"split": "fold"}})


def test_the_toy_gets_its_proxy_points_and_final_proxies(toy, tmp_path):
    from dmlrepro.train.outputs import write_final_proxies
    from dmlrepro.train.state import RunDir

    loss = build_loss("toy_proxy", 3, 4, margin=0.25)
    points, labels = proxy_points(loss)
    expected = loss.centres.detach() / loss.centres.detach().norm(dim=1, keepdim=True)
    assert torch.allclose(points, expected) and labels.tolist() == [0, 0, 1, 1, 2, 2]
    rundir = RunDir(tmp_path)
    write_final_proxies(rundir, loss, np.array([4, 7, 9]))
    with np.load(rundir.final_proxies) as saved:
        assert np.array_equal(saved["proxies"], loss.centres.detach().numpy())  # as trained
        assert saved["labels"].tolist() == [4, 4, 7, 7, 9, 9]


def test_the_toy_gets_the_proxy_metrics(toy):
    from dmlrepro.train.hooks import proxy_metrics

    loss = build_loss("toy_proxy", 2, 4, margin=0.25, per_class=1)
    emb = np.random.default_rng(0).normal(size=(6, 4))
    labels = np.array([0, 0, 0, 1, 1, 1])

    class Embedder:
        def embed(self, dataset, desc=""):
            return emb, labels, None

    cfg = resolve_run_config({**_toy_config(), "eval": {"proxy_metrics": ["avg_dtp"]}})
    got = proxy_metrics(cfg, Embedder(), None, lambda y: y, loss)
    centres = (loss.centres / loss.centres.norm(dim=1, keepdim=True)).detach().double().numpy()
    # RSW eq. 9 written out: the mean over classes of the mean distance of a class's samples to its proxy
    literal = np.mean([np.mean([np.linalg.norm(e - centres[c]) for e in emb[labels == c]]) for c in (0, 1)])
    assert got["avg_dtp"] == pytest.approx(literal, rel=1e-6)


def test_the_toy_gets_its_lr_groups(toy):
    from dmlrepro.train.model_and_loss import build_run_model
    from dmlrepro.train.optim import build_optimizer, group_lrs, linked_groups, named_groups, set_lrs

    cfg = resolve_run_config({**_toy_config(), "schedule": {"name": "step", "step": 1, "gamma": 0.5}})
    model, loss = build_run_model(cfg), build_loss("toy_proxy", 3, 4, margin=0.25)
    groups = named_groups(model, loss)
    assert groups["loss"] == [loss.centres] and groups["loss.scale"] == [loss.scale]
    optimizer = build_optimizer(cfg, groups, linked_groups(loss))
    for epoch in (1, 3):
        lrs = group_lrs(cfg, epoch)
        set_lrs(optimizer, lrs)
        by_name = {group["name"]: group["lr"] for group in optimizer.param_groups}
        assert by_name["loss.scale"] == pytest.approx(0.5 * lrs["head"])
        assert by_name["head"] == pytest.approx(0.1 * 0.5 ** (epoch - 1))


def test_the_toy_papers_model_preset(toy):
    from dmlrepro.models import build_model
    from dmlrepro.models.model import model_presets

    assert model_presets()["toy_paper"] == {"pool": "avg", "head": "linear", "l2_normalize": True}
    model = build_model(backbone="tiny_cnn", preset="toy_paper", embedding_size=4)
    assert model.l2_normalize and model.pool.mode == "avg"


@pytest.mark.slow
def test_a_toy_run_gets_proxy_metrics_final_proxies_and_its_lr_group(toy, tmp_path):
    """The whole run: metrics.json's proxy metrics, final_proxies.npz equal to the final checkpoint's
    centres, and train_log.csv's lr of the linked group."""
    from dmlrepro.train import list_checkpoints, read_checkpoint, train_run
    from dmlrepro.train.state import RunDir

    cfg = {
        **_toy_config(hparams={"per_class": 1}),
        "dataset": {
            "name": "synthetic",
            "root": str(tmp_path / "data"),
            "params": {"num_classes": 8, "images_per_class": 6, "size": 32},
            "image_size": 32,
            "resize": 32,
            "batch_size": 16,
            "eval_batch_size": 64,
        },
        "eval": {"proxy_metrics": ["w2", "avg_dtp"]},
        "epochs": 2,
        "steps_per_epoch": 2,
        "seed": 0,
        "threads": 1,
    }
    record = train_run(cfg, tmp_path / "run", progress=False)
    assert record["status"] == "completed" and set(record["proxy_metrics"]) == {"w2", "avg_dtp"}
    rundir = RunDir(tmp_path / "run")
    final = read_checkpoint(list_checkpoints(rundir.checkpoints)[-1])
    with np.load(rundir.final_proxies) as saved:
        assert torch.equal(torch.from_numpy(saved["proxies"]), final["loss"]["centres"])
        assert saved["labels"].tolist() == [0, 1, 2, 3]  # one centre per training class (the first half)
    with open(rundir.train_log, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["steps"] != "0"]  # epoch 0: the untrained evaluation
    assert len(rows) == 2
    assert [float(row["lr_loss.scale"]) for row in rows] == pytest.approx([0.5 * float(row["lr_head"]) for row in rows])
