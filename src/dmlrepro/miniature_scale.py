"""The miniature's distance scale (docs/miniature.md#the-scaling-rule): how far an embedding starts
from its class proxy under RSW's head, in the papers' network and in the miniature's.

RSW's head is LayerNorm without affine parameters, then a Linear layer with Kaiming fan-out
initialisation (RSW-R10), and its proxies are Kaiming fan-out normal (``RSWLoss``). LayerNorm maps any
pooled feature vector of width C to norm √C, so the initial distance to proxy (AvgDTP, RSW eq. 9, at
epoch 0) depends on the head's shape alone, not on the trunk's weights: it is measured here by
building the head and the loss and embedding random features. The ratio of the miniature's to the
paper's is the one factor by which the miniature rescales distance-valued settings (RSW's α and its
inverse-distance scale s); dimensionless settings are the papers'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dmlrepro.losses.rsw import RSWLoss
from dmlrepro.models.heads import build_head

__all__ = ["HeadShape", "PAPER_RSW_HEAD", "initial_distance_to_proxy", "distance_scale"]


@dataclass(frozen=True)
class HeadShape:
    """The pooled width C, the embedding size D and the number of training classes (one proxy each)."""

    in_features: int
    embedding_size: int
    num_classes: int


#: RSW Sec. IV-B on CUB-200-2011: ResNet-50 (C = 2048), 512-d embeddings (Table I's R512), 100 training classes.
PAPER_RSW_HEAD = HeadShape(in_features=2048, embedding_size=512, num_classes=100)


def initial_distance_to_proxy(shape: HeadShape, samples: int = 4096, seed: int = 0) -> float:
    """AvgDTP (RSW eq. 9) of a freshly initialised RSW head and proxies: the mean over classes of the
    mean distance from the class's embeddings to its proxy, ``samples`` random feature vectors."""
    gen = torch.Generator().manual_seed(seed)
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        head, _ = build_head("layernorm_linear", shape.in_features, shape.embedding_size, init="kaiming_fan_out")
        loss = RSWLoss(shape.num_classes, shape.embedding_size, alpha=0.0, k1=1.0, k2=1.0)
    finally:
        torch.random.set_rng_state(torch_state)
    with torch.no_grad():
        features = torch.rand(samples, shape.in_features, generator=gen)
        labels = torch.arange(samples) % shape.num_classes
        distances = (head(features) - loss.proxies[labels]).norm(dim=1)
        per_class = torch.zeros(shape.num_classes).index_add_(0, labels, distances) / torch.bincount(labels).float()
    return float(per_class.mean())


def distance_scale(miniature: HeadShape, paper: HeadShape = PAPER_RSW_HEAD) -> float:
    """The miniature's initial distance to proxy over the paper's: the factor for distance-valued settings."""
    return initial_distance_to_proxy(miniature) / initial_distance_to_proxy(paper)
