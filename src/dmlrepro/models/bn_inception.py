"""BN-Inception (Inception-v2 with batch normalisation; Ioffe & Szegedy 2015).

timm has no BN-Inception, so it is defined here. The layer names, their order and every
shape follow Cadene's ``pretrainedmodels.models.bninception.BNInception`` (the module the
DML codebases load ``bn_inception-52deb4733.pth`` into: Proxy-Anchor, MS-loss, the MLRC
powerful-benchmarker), so that ``state_dict()`` has exactly that file's key layout:

    conv1_7x7_s2.{weight,bias}          (64, 3, 7, 7), (64,)
    conv1_7x7_s2_bn.{weight,bias,running_mean,running_var}
    conv2_3x3_reduce ... conv2_3x3 ...
    inception_3a_1x1 ... inception_5b_pool_proj_bn ...
    last_linear.{weight,bias}           (1000, 1024), (1000,)   -- only with num_classes > 0

Every convolution has a bias (the Caffe port), every one is followed by a BatchNorm and a
ReLU. In Cadene's code the ReLUs are in-place, so the tensors that are concatenated and fed
on are the post-ReLU ones; this implementation writes that out explicitly.

Input convention of the pretrained weights (Caffe): **BGR** channel order, range **0-255**,
mean ``[104, 117, 128]`` (B, G, R) subtracted, std 1. The data layer produces it; the
model only advertises it in :data:`INPUT_CONFIG`.

Output: ``forward_features`` gives a ``(B, 1024, H/32, W/32)`` map (7x7 at 224 px); Cadene's
own head is ``AvgPool2d(7)`` + ``last_linear``. ``forward`` reproduces Cadene's logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BNInception", "INPUT_CONFIG", "INCEPTION_BLOCKS"]

#: Input convention of Cadene's ImageNet weights (``pretrained_settings["bninception"]``).
INPUT_CONFIG = {
    "input_convention": "bgr255",
    "input_space": "BGR",
    "input_range": (0, 255),
    "mean": (104.0, 117.0, 128.0),
    "std": (1.0, 1.0, 1.0),
}

# Inception blocks, in order. Type "A" has four branches: 1x1 | 3x3_reduce->3x3 |
# double_3x3_reduce->double_3x3_1->double_3x3_2 | pool->pool_proj. Type "B" (grid reduction)
# has 3x3_reduce->3x3(stride 2) | double_3x3_reduce->_1->_2(stride 2) | max-pool(stride 2),
# with no 1x1 and no pool projection.
# Columns: name, type, in, 1x1, 3x3_reduce, 3x3, double_reduce, double_1, double_2, pool_proj, pool
INCEPTION_BLOCKS: tuple[tuple, ...] = (
    ("3a", "A", 192, 64, 64, 64, 64, 96, 96, 32, "avg"),
    ("3b", "A", 256, 64, 64, 96, 64, 96, 96, 64, "avg"),
    ("3c", "B", 320, 0, 128, 160, 64, 96, 96, 0, "max"),
    ("4a", "A", 576, 224, 64, 96, 96, 128, 128, 128, "avg"),
    ("4b", "A", 576, 192, 96, 128, 96, 128, 128, 128, "avg"),
    ("4c", "A", 576, 160, 128, 160, 128, 160, 160, 128, "avg"),
    ("4d", "A", 608, 96, 128, 192, 160, 192, 192, 128, "avg"),
    ("4e", "B", 608, 0, 128, 192, 192, 256, 256, 0, "max"),
    ("5a", "A", 1056, 352, 192, 320, 160, 224, 224, 128, "avg"),
    ("5b", "A", 1024, 352, 192, 320, 192, 224, 224, 128, "max"),
)


class BNInception(nn.Module):
    """BN-Inception trunk with Cadene's parameter names.

    Args:
        num_classes: size of ``last_linear`` (1000 for the ImageNet file); 0 leaves it out,
            which is how the embedding models use the trunk.
        bn_momentum: BatchNorm momentum. Cadene's module (and the DML codebases copying it)
            set ``momentum=0.9`` -- a Caffe-port artefact meaning, in PyTorch semantics,
            that each batch gets weight 0.9 in the running statistics. Kept as the default
            for fidelity; it only matters when BN statistics are not frozen.
    """

    num_features = 1024

    def __init__(self, num_classes: int = 0, bn_momentum: float = 0.9) -> None:
        super().__init__()
        self.num_classes = int(num_classes)
        self._units: dict[str, tuple[str, str]] = {}  # unit name -> (conv attr, bn attr)
        self._bn_momentum = bn_momentum

        self._unit("conv1_7x7_s2", 3, 64, 7, stride=2, padding=3)
        self.pool1_3x3_s2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self._unit("conv2_3x3_reduce", 64, 64, 1)
        self._unit("conv2_3x3", 64, 192, 3, padding=1)
        self.pool2_3x3_s2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)

        for name, kind, cin, c1, r3, c3, rd, d1, d2, pp, pool in INCEPTION_BLOCKS:
            p = f"inception_{name}"
            if kind == "A":
                self._unit(f"{p}_1x1", cin, c1, 1)
            stride = 2 if kind == "B" else 1
            self._unit(f"{p}_3x3_reduce", cin, r3, 1)
            self._unit(f"{p}_3x3", r3, c3, 3, stride=stride, padding=1)
            self._unit(f"{p}_double_3x3_reduce", cin, rd, 1)
            self._unit(f"{p}_double_3x3_1", rd, d1, 3, padding=1)
            self._unit(f"{p}_double_3x3_2", d1, d2, 3, stride=stride, padding=1)
            if kind == "A":
                if pool == "avg":
                    pool_layer: nn.Module = nn.AvgPool2d(3, stride=1, padding=1, ceil_mode=True, count_include_pad=True)
                else:
                    pool_layer = nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True)
                setattr(self, f"{p}_pool", pool_layer)
                self._unit(f"{p}_pool_proj", cin, pp, 1)
            else:
                setattr(self, f"{p}_pool", nn.MaxPool2d(3, stride=2, ceil_mode=True))

        if self.num_classes > 0:
            self.last_linear = nn.Linear(self.num_features, self.num_classes)

    # -- construction helper -------------------------------------------------------------
    def _unit(self, name: str, cin: int, cout: int, k: int, stride: int = 1, padding: int = 0):
        """conv ``name`` (with bias) followed by BatchNorm ``name + '_bn'``."""
        setattr(self, name, nn.Conv2d(cin, cout, k, stride=stride, padding=padding, bias=True))
        setattr(self, f"{name}_bn", nn.BatchNorm2d(cout, eps=1e-5, momentum=self._bn_momentum))
        self._units[name] = (name, f"{name}_bn")

    def _cbr(self, name: str, x: torch.Tensor) -> torch.Tensor:
        conv, bn = self._units[name]
        return F.relu(getattr(self, bn)(getattr(self, conv)(x)))

    # -- forward -----------------------------------------------------------------------------
    def _block(self, name: str, kind: str, x: torch.Tensor) -> torch.Tensor:
        p = f"inception_{name}"
        branches = []
        if kind == "A":
            branches.append(self._cbr(f"{p}_1x1", x))
        branches.append(self._cbr(f"{p}_3x3", self._cbr(f"{p}_3x3_reduce", x)))
        d = self._cbr(f"{p}_double_3x3_reduce", x)
        d = self._cbr(f"{p}_double_3x3_2", self._cbr(f"{p}_double_3x3_1", d))
        branches.append(d)
        pooled = getattr(self, f"{p}_pool")(x)
        branches.append(self._cbr(f"{p}_pool_proj", pooled) if kind == "A" else pooled)
        return torch.cat(branches, dim=1)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` BGR 0-255 mean-subtracted -> ``(B, 1024, h, w)`` feature map."""
        x = self.pool1_3x3_s2(self._cbr("conv1_7x7_s2", x))
        x = self._cbr("conv2_3x3", self._cbr("conv2_3x3_reduce", x))
        x = self.pool2_3x3_s2(x)
        for name, kind, *_ in INCEPTION_BLOCKS:
            x = self._block(name, kind, x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Cadene's ``logits(features(x))``: global average pool, then ``last_linear``."""
        x = self.forward_features(x).mean(dim=(2, 3))
        if self.num_classes > 0:
            x = self.last_linear(x)
        return x
