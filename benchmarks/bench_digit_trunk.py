"""The digit-pretrained trunk on the multi-digit datasets: test-class R@1 of the network a run starts
from (random init, and the digit trunk with a fresh head: the "untrained" row) and after a short
Proxy Anchor fine-tuning from the digit trunk (docs/benchmarks.md#the-digit-pretrained-trunk).

The fine-tuning follows the embedded default's recipe structure (config/config.yaml ``defaults``):
tiny_cnn at widths 24-48-96-96, a 64-d L2-normalised linear head, BN frozen, one warm-up epoch with
the trunk frozen, Adam lr 2e-3 with the proxies at x100, batches of 64 = 16 classes x 4
(the engine's seeded MPerClassBatchSampler), Proxy Anchor margin 0.1, alpha 32; 32 px inputs (64 px
and 84 px canvases resized), no flips (a flip turns "37" into a mirrored "73"). Training classes: the
protocol's 64 (the 16 validation classes are left out), ``--train-per-class`` images each; test: the
20 test classes, ``--test-per-class`` images each. One torch thread for the fine-tuning; the
pretraining runs on the trunk's fixed 2 threads (``PRETRAIN_THREADS``: the weights depend on it).

    python benchmarks/bench_digit_trunk.py --data-root data --dataset double_digits --out dd.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from pytorch_metric_learning.losses import ProxyAnchorLoss

from dmlrepro.data.registry import load
from dmlrepro.data.samplers import MPerClassBatchSampler
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK
from dmlrepro.evaluation.retrieval import retrieval_metrics
from dmlrepro.models import build_model
from dmlrepro.models.digit_trunk import load_digit_trunk, normalise, pretrain

TRAIN_CLASSES = 64  # labels 0-63: the protocol's training classes (64-79 validate, 80-99 test)


def _images(manifest, rows, size):
    x = torch.from_numpy(np.stack([np.asarray(Image.open(manifest.abspath(i)).convert("L")) for i in rows]))[:, None]
    if x.shape[-1] != size:
        x = F.interpolate(x.float(), size=(size, size), mode="bilinear", antialias=True).round().clamp(0, 255)
    return x.to(torch.uint8).expand(-1, 3, -1, -1).contiguous(), torch.from_numpy(manifest.labels[rows])


def _first(manifest, split, per_class, keep):
    rows = manifest.indices(split)
    out, seen = [], {}
    for i in rows:
        c = int(manifest.labels[i])
        if keep(c) and seen.get(c, 0) < per_class:
            seen[c] = seen.get(c, 0) + 1
            out.append(i)
    return np.asarray(out)


@torch.no_grad()
def _r1(model, x, y) -> float:
    model.eval()
    emb = torch.cat([model(normalise(x[i : i + 256], model.input_config)) for i in range(0, len(x), 256)])
    return 100.0 * retrieval_metrics(emb, y, ks=(1,))["recall@1"]


def _model(kwargs, seed, recipe=None, folder=None):
    torch.manual_seed(seed)
    m = build_model(backbone="tiny_cnn", backbone_kwargs=kwargs, embedding_size=64, l2_normalize=True)
    if recipe is not None:
        load_digit_trunk(m, recipe, folder, kwargs)
    return m


def _finetune(model, x, y, epochs, seed, log):
    """Proxy Anchor with the defaults' recipe structure, in place."""
    loss_fn = ProxyAnchorLoss(num_classes=TRAIN_CLASSES, embedding_size=64, margin=0.1, alpha=32)
    bn = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in bn:
        for p in m.parameters():
            p.requires_grad_(False)
    trunk = [p for n, p in model.named_parameters() if n.startswith("backbone.") and p.requires_grad]
    head = [p for n, p in model.named_parameters() if not n.startswith("backbone.") and p.requires_grad]
    opt = torch.optim.Adam(
        [{"params": trunk}, {"params": head}, {"params": loss_fn.parameters(), "lr": 2e-3 * 100}], lr=2e-3
    )
    sampler = MPerClassBatchSampler(y.numpy(), m=4, batch_size=64, seed=seed)  # the engine's: seeded per epoch
    for epoch in range(epochs):
        model.train()
        for m in bn:
            m.eval()  # running statistics frozen
        warm = epoch == 0  # the trunk frozen for the first epoch
        for p in trunk:
            p.requires_grad_(not warm)
        batches = sampler.epoch_batches(epoch)
        t0, total = time.perf_counter(), 0.0
        for batch in batches:
            idx = torch.as_tensor(batch)
            loss = loss_fn(model(normalise(x[idx], model.input_config)), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach())
        log(
            f"  epoch {epoch + 1}/{epochs}{' (warm-up)' if warm else ''}: loss {total / len(batches):.3f}, "
            f"{time.perf_counter() - t0:.1f} s"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-root", default="data")
    p.add_argument("--dataset", default="double_digits")
    p.add_argument("--weights-dir", default="results/digit_trunk")
    p.add_argument("--pretrain-epochs", type=int, default=None, help="the recipe's epochs (default: the recipe's)")
    p.add_argument("--digits-per-class", type=int, default=None, help="the recipe's digits_per_class")
    p.add_argument("--train-per-class", type=int, default=60)
    p.add_argument("--test-per-class", type=int, default=100)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    kwargs = {"widths": [24, 48, 96, 96]}
    recipe = {"dataset": a.dataset, "backbone_kwargs": kwargs}
    if a.pretrain_epochs is not None:
        recipe["epochs"] = a.pretrain_epochs
    if a.digits_per_class is not None:
        recipe["digits_per_class"] = a.digits_per_class
    r = DIGIT_TRUNK.resolve(recipe)
    path = DIGIT_TRUNK.weights_file(a.weights_dir, r)
    t0 = time.perf_counter()
    if not path.is_file():
        print(f"pretraining {path}: {pretrain(r, path, a.data_root)}", flush=True)
    pretrain_s = time.perf_counter() - t0
    torch.set_num_threads(1)
    m = load(a.dataset, a.data_root)
    xtr, ytr = _images(m, _first(m, "train", a.train_per_class, lambda c: c < TRAIN_CLASSES), r["size"])
    xte, yte = _images(m, _first(m, "test", a.test_per_class, lambda c: True), r["size"])
    out = {"dataset": a.dataset, "recipe": r, "weights": str(path), "pretrain_seconds": round(pretrain_s, 1)}
    out["train_images"], out["test_images"] = len(ytr), len(yte)
    out["r1_random_init"] = _r1(_model(kwargs, a.seed), xte, yte)
    model = _model(kwargs, a.seed, r, a.weights_dir)
    out["r1_digit_trunk_untrained"] = _r1(model, xte, yte)
    print(json.dumps(out), flush=True)
    t0 = time.perf_counter()
    _finetune(model, xtr, ytr, a.epochs, a.seed, lambda s: print(s, flush=True))
    out["finetune_seconds"] = round(time.perf_counter() - t0, 1)
    out["r1_proxy_anchor"] = _r1(model, xte, yte)
    out["gain"] = out["r1_proxy_anchor"] - out["r1_digit_trunk_untrained"]
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
