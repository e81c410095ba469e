"""ResNetV2-20: the pre-activation bottleneck CIFAR ResNet of ASAP's MNIST experiments.

ASAP (Gürbüz et al., §4.4, "Embedding function"; MNIST runs §5.2) uses "ResNetV2-20 (He et al., 2016) for MNIST",
"until the output of the global average pooling layer", plus a fully connected layer to a 2-d
embedding (our ``asap`` head). The authors' code, github.com/yetigurbuz/ccp-dml, defines it as
``CifarResNet`` (``framework/models/backbones/resnets.py``; defaults ``stages=3, blocks=2,
block_repeats=1, final_activation=True``, every activation block ``BN_ReLU``, shortcut
``spatial_aggregation='skip'``) built from ``resMap``/``resBlock``/``resnetBlock`` in
``framework/layers/residual.py``: the Keras ``cifar10_resnet`` ``resnet_v2`` with depth 9n+2 = 20
(n = 2 bottleneck blocks per stage, its docstring copied verbatim). As written there:

- stem: ``Conv2D(16, 3, strides=1, padding='same')`` *with* bias, BN, ReLU;
- block = ``[BN-ReLU] -> conv1x1(mid, stride s) -> BN-ReLU -> conv3x3(mid) -> BN-ReLU ->
  conv1x1(out)``, all three without bias, added to the shortcut (identity, or in a stage's
  first block a bias-free ``conv1x1(out, stride s)`` of the block's *un-activated* input);
- out widths 64/128/256 (``in_dim * 4``, then ``* 2``); stride 2 on the first block of stages
  1 and 2, on the 1x1 convs; the very first block has no pre-activation (the stem ends in one);
- mid widths: ``out // 4`` = 16 in stage 0's first block, ``out // 2`` elsewhere
  (``resBlock`` is called with ``out_dim_reduction_rate=2``), i.e. 16, 32 | 64, 64 | 128, 128.
  Keras' example uses 16 in both stage-0 blocks; ccp-dml's 32 is kept here;
- a final BN-ReLU before pooling; 256-d features.

Depth 20 = 19 convolutions on the main path (stem + 6 x 3) + the fully connected layer
(Keras' classifier, ASAP's embedding layer); the 3 projection shortcuts are not counted
(He et al.). Keras defaults throughout: Glorot-uniform conv kernels, zero bias, BatchNorm
``momentum=0.99, epsilon=1e-3`` (PyTorch ``momentum=0.01, eps=1e-3``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ResNet20V2", "LAYOUT"]

#: Per block: (in, mid, out, stride, pre-activation, projection shortcut); see the module docstring.
LAYOUT = (
    (16, 16, 64, 1, False, True),
    (64, 32, 64, 1, True, False),
    (64, 64, 128, 2, True, True),
    (128, 64, 128, 1, True, False),
    (128, 128, 256, 2, True, True),
    (256, 128, 256, 1, True, False),
)
BN_EPS = 1e-3  # Keras BatchNormalization default


def _bn(channels: int, momentum: float) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=momentum)


class Bottleneck(nn.Module):
    """ccp-dml ``resMap`` (projection) / ``resBlock`` (identity), with r = ReLU:
    ``shortcut(x) + conv3(r(bn3(conv2(r(bn2(conv1(r(bn1(x)))))))))``; no ``bn1`` in the first block."""

    def __init__(
        self, cin: int, mid: int, cout: int, stride: int, preact: bool, projection: bool, bn_momentum: float
    ) -> None:
        super().__init__()
        self.bn1 = _bn(cin, bn_momentum) if preact else None
        self.conv1 = nn.Conv2d(cin, mid, 1, stride=stride, bias=False)
        self.bn2 = _bn(mid, bn_momentum)
        self.conv2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False)
        self.bn3 = _bn(mid, bn_momentum)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if projection else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.bn1 is None else F.relu(self.bn1(x))
        h = self.conv1(h)
        h = self.conv2(F.relu(self.bn2(h)))
        h = self.conv3(F.relu(self.bn3(h)))
        return (x if self.shortcut is None else self.shortcut(x)) + h


class ResNet20V2(nn.Module):
    """ResNetV2-20 trunk (ccp-dml ``CifarResNet`` defaults); ``forward_features``: ``(B, 256, h, w)``
    with h = ceil(H / 4) (28 px -> 7, 32 px -> 8); random init only.

    ``bn_momentum`` is PyTorch's (1 - Keras momentum): 0.01 as in the authors' code; short runs
    may want 0.1 (``backbone_kwargs``).
    """

    def __init__(self, in_chans: int = 3, bn_momentum: float = 0.01) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_chans, LAYOUT[0][0], 3, padding=1, bias=True)
        self.stem_bn = _bn(LAYOUT[0][0], bn_momentum)
        self.blocks = nn.Sequential(*(Bottleneck(*spec, bn_momentum=bn_momentum) for spec in LAYOUT))
        self.num_features = LAYOUT[-1][2]
        self.final_bn = _bn(self.num_features, bn_momentum)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # Keras Conv2D defaults: glorot_uniform kernel, zero bias
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_bn(self.stem(x)))
        return F.relu(self.final_bn(self.blocks(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.forward_features(x), 1).flatten(1)
