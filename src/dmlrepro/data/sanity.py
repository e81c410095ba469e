"""Difficulty sanity numbers for the embedded datasets (docs/data.md "synthetic").

Leave-one-out Recall@1 by brute force in numpy (float64, Euclidean), on (a) raw pixels and (b) the
features of a small randomly initialised CNN, for a split of a manifest. A trained network's
number is added later by the training engine; these two bound "untrained" from below.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .dataset import ManifestDataset
from .manifest import Manifest, read_manifest


def recall_at_1(features: np.ndarray, labels: np.ndarray, chunk: int = 1024) -> float:
    """Fraction of items whose nearest other item (Euclidean) has the same label."""
    x = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels)
    sq = (x * x).sum(1)
    hits = 0
    for s in range(0, len(x), chunk):
        d = sq[s : s + chunk, None] + sq[None, :] - 2.0 * x[s : s + chunk] @ x.T
        d[np.arange(d.shape[0]), np.arange(s, s + d.shape[0])] = np.inf  # exclude the query itself
        hits += int((labels[d.argmin(1)] == labels[s : s + chunk]).sum())
    return hits / len(x)


def _images(ds: ManifestDataset) -> torch.Tensor:
    return torch.stack([ds[i][0] for i in range(len(ds))]).float() / 255.0


def random_cnn(seed: int = 0, width: int = 32) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers, c = [], 3
    for w in (width, 2 * width, 4 * width, 4 * width):
        layers += [torch.nn.Conv2d(c, w, 3, padding=1), torch.nn.BatchNorm2d(w), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
        c = w
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()]
    return torch.nn.Sequential(*layers).eval()


def sanity_recall(manifest: Manifest | str | os.PathLike, split: str = "test", seed: int = 0) -> dict[str, float]:
    m = manifest if isinstance(manifest, Manifest) else read_manifest(manifest)
    ds = ManifestDataset(m, split=split)
    x = _images(ds)
    labels = ds.labels
    out = {
        "n": len(ds),
        "classes": int(len(np.unique(labels))),
        "chance": float(np.mean([(np.sum(labels == label) - 1) / (len(labels) - 1) for label in labels])),
    }
    out["r1_pixels"] = recall_at_1(x.flatten(1).numpy(), labels)
    mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    with torch.no_grad():
        feats = random_cnn(seed)((x - mean) / std).numpy()
    out["r1_random_cnn"] = recall_at_1(feats, labels)
    return out
