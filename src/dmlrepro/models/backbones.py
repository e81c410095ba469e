"""Backbone registry (timm style): every trunk is reachable by the name used in config.

A trunk is an ``nn.Module`` with ``forward_features(x)`` returning either a feature map
``(B, C, h, w)`` (CNNs) or a token sequence ``(B, N, C)`` (ViTs), and ``num_features = C``.
timm models are created with ``pretrained=False, num_classes=0, global_pool=""`` (no
download ever happens here; pretrained weights come from the cache, see ``weights.py``)
and pooled by our own :class:`~dmlrepro.models.heads.GlobalPool`.

Adding a backbone is one :func:`register_backbone` call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dmlrepro.config_names import BACKBONE_ALIASES, canonical_backbone

from .bn_inception import INPUT_CONFIG as _BNI_INPUT, BNInception
from .resnet_v2 import ResNet20V2

__all__ = [
    "BackboneSpec",
    "BACKBONES",
    "ALIASES",
    "TinyCNN",
    "register_backbone",
    "resolve_backbone_name",
    "get_backbone_spec",
    "list_backbones",
    "create_backbone",
]

IMAGENET_INPUT = {
    "input_convention": "rgb_imagenet",
    "input_space": "RGB",
    "input_range": (0, 1),
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
}
HALF_INPUT = {  # timm AugReg ViTs (Google ViT convention); resnetv2_20 (greyscale digits, from scratch)
    "input_convention": "rgb_half",
    "input_space": "RGB",
    "input_range": (0, 1),
    "mean": (0.5, 0.5, 0.5),
    "std": (0.5, 0.5, 0.5),
}


@dataclass(frozen=True)
class BackboneSpec:
    name: str
    builder: Callable[..., nn.Module]
    kind: str  # "cnn" (feature map) | "vit" (token sequence)
    default_pool: str
    default_weights: str | None
    input_config: dict[str, Any] = field(default_factory=lambda: dict(IMAGENET_INPUT))
    description: str = ""


BACKBONES: dict[str, BackboneSpec] = {}

#: Other names used in configs for the same trunk (kept torch-free in dmlrepro.config_names).
ALIASES: dict[str, str] = BACKBONE_ALIASES


def register_backbone(spec: BackboneSpec) -> BackboneSpec:
    if spec.name in BACKBONES or spec.name in ALIASES:
        raise ValueError(f"backbone name {spec.name!r} registered twice")
    BACKBONES[spec.name] = spec
    return spec


def resolve_backbone_name(name: str) -> str:
    """Canonical registry name for ``name`` (aliases resolved); raises for unknown names."""
    return canonical_backbone(name, BACKBONES)


def get_backbone_spec(name: str) -> BackboneSpec:
    return BACKBONES[resolve_backbone_name(name)]


def list_backbones() -> list[str]:
    return sorted(BACKBONES)


def create_backbone(name: str, **kwargs: Any) -> nn.Module:
    """Build the (randomly initialised) trunk ``name``; ``kwargs`` go to its builder."""
    return get_backbone_spec(name).builder(**kwargs)


# -- timm ------------------------------------------------------------------------------------
def _timm_builder(arch: str) -> Callable[..., nn.Module]:
    def build(**kwargs: Any) -> nn.Module:
        import timm  # deferred: timm (seconds), only timm backbones need it

        for key in ("pretrained", "num_classes", "global_pool"):
            if key in kwargs:
                raise ValueError(f"backbone_kwargs may not set {key!r} (fixed by dmlrepro)")
        return timm.create_model(arch, pretrained=False, num_classes=0, global_pool="", **kwargs)

    build.__name__ = f"timm_{arch.replace('.', '_')}"
    return build


# -- tiny CNN for the CPU-sized embedded default ---------------------------------------------
class TinyCNN(nn.Module):
    """A few ``conv3x3 -> BN -> ReLU`` layers for 32-48 px images (random init only).

    Defaults: widths (32, 64, 128, 128), strides (2, 2, 2, 1): a 32 px image gives a
    4x4x128 map; about 3 M multiply-adds per 32 px image, ~12x fewer than resnet18.
    ``drop_rate`` > 0 adds element-wise dropout on the output map in training.
    """

    def __init__(
        self,
        widths: Sequence[int] = (32, 64, 128, 128),
        strides: Sequence[int] = (2, 2, 2, 1),
        in_chans: int = 3,
        drop_rate: float = 0.0,
    ) -> None:
        super().__init__()
        if len(widths) != len(strides) or not widths:
            raise ValueError(f"TinyCNN needs as many widths as strides, got {widths} and {strides}")
        layers: list[nn.Module] = []
        cin = in_chans
        for w, s in zip(widths, strides):
            layers += [
                nn.Conv2d(cin, int(w), 3, stride=int(s), padding=1, bias=False),
                nn.BatchNorm2d(int(w)),
                nn.ReLU(inplace=True),
            ]
            cin = int(w)
        self.features = nn.Sequential(*layers)
        self.num_features = cin
        self.drop = nn.Dropout(float(drop_rate)) if drop_rate else nn.Identity()
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.forward_features(x), 1).flatten(1)


# -- registry ----------------------------------------------------------------------------------
register_backbone(
    BackboneSpec(
        "resnet50",
        _timm_builder("resnet50.tv_in1k"),
        "cnn",
        "avg",
        "resnet50.tv_in1k",
        description="ResNet-50 (timm, torchvision keys); 2048-d; PFML R50, RSW, Proxy-Anchor",
    )
)
register_backbone(
    BackboneSpec(
        "bn_inception",
        lambda **kw: BNInception(num_classes=0, **kw),
        "cnn",
        "avg",
        "bn_inception.imagenet",
        input_config=dict(_BNI_INPUT),
        description="BN-Inception (Cadene layout, defined here); 1024-d; PFML IBN, MLRC, ASAP",
    )
)
register_backbone(
    BackboneSpec(
        "vit_small_patch16_224",
        _timm_builder("vit_small_patch16_224.augreg_in21k_ft_in1k"),
        "vit",
        "cls",
        "vit_small_patch16_224.augreg_in21k_ft_in1k",
        input_config=dict(HALF_INPUT),
        description="ViT-S/16 (timm AugReg in21k->in1k); 384-d CLS token; PFML ViT",
    )
)
register_backbone(
    BackboneSpec(
        "dino_vits16",
        _timm_builder("vit_small_patch16_224.dino"),
        "vit",
        "cls",
        "vit_small_patch16_224.dino",
        description="DINO ViT-S/16 (timm vit_small_patch16_224.dino); 384-d CLS token; PFML DINO",
    )
)
register_backbone(
    BackboneSpec(
        "resnet18",
        _timm_builder("resnet18.tv_in1k"),
        "cnn",
        "avg",
        "resnet18.tv_in1k",
        description="ResNet-18 (timm); 512-d; small CPU option",
    )
)
register_backbone(
    BackboneSpec(
        "resnet10t",
        _timm_builder("resnet10t"),
        "cnn",
        "avg",
        None,
        description="timm ResNet-10-T (tiered stem); 512-d; small CPU option, random init",
    )
)
register_backbone(
    BackboneSpec(
        "mobilenetv3_small_100",
        _timm_builder("mobilenetv3_small_100"),
        "cnn",
        "avg",
        None,
        description="timm MobileNetV3-Small 1.0 trunk (576-d before its conv head); random init",
    )
)
register_backbone(
    BackboneSpec(
        "tiny_cnn",
        lambda **kw: TinyCNN(**kw),
        "cnn",
        "avg",
        None,
        description="4 conv-BN-ReLU layers, 128-d; the embedded default's CPU backbone (32-48 px)",
    )
)
# ASAP's MNIST trunk. rgb_half: (x - 0.5) / 0.5 per channel; the ImageNet statistics mean
# nothing for grey digits replicated to 3 equal channels and trained from scratch.
register_backbone(
    BackboneSpec(
        "resnetv2_20",
        lambda **kw: ResNet20V2(**kw),
        "cnn",
        "avg",
        None,
        input_config=dict(HALF_INPUT),
        description="ResNetV2-20 (pre-activation bottleneck, ccp-dml CifarResNet); 256-d; ASAP MNIST, random init",
    )
)
