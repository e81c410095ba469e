"""Global pooling and embedding heads, selectable by name.

Pooling (``pool``), applied to the trunk's output:

- CNN feature maps ``(B, C, H, W)``:
  ``avg`` (GAP), ``max`` (GMP), ``avg+max`` (GAP + GMP **summed**: Proxy-Anchor
  ``net/resnet.py`` and RSW ``Model.py``, ``AdaptiveMaxPool2d(1)(x) + AdaptiveAvgPool2d(1)(x)``),
  ``catavgmax`` (``[GAP, GMP]`` concatenated, 2C; timm's name). Note timm's own ``avgmax``
  is the *mean* of the two, which none of the papers uses, so it is not offered.
- ViT token sequences ``(B, N, C)``: ``cls`` (the class token, as PFML's reading for
  ViT-S / DINO and the DINO/Hyp/HIER codebases), ``token_avg`` (mean of the patch tokens).

Heads (``head``), applied to the pooled vector:

- ``linear``: ``Linear(C, D)`` (Proxy-Anchor, PFML, ASAP);
- ``layernorm_linear``: ``LayerNorm(C, elementwise_affine=False)`` then ``Linear(C, D)`` (RSW);
- ``linear_layernorm``: ``Linear(C, D)`` then ``LayerNorm(D, elementwise_affine=False)`` (HIST's
  ``net/resnet.py``, ``--layer-norm 1``);
- ``mlp``: powerful-benchmarker's ``MLP([C, *hidden, D], final_relu=False)`` (the MLRC
  embedder ``[128]`` is exactly one ``Linear(C, 128)``). Faithful to that class, the ReLUs
  come *before* the Linears, on every Linear but the last: ``[C, h, D]`` gives
  ``ReLU, Linear(C, h), Linear(h, D)``;
- ``none``: identity (``embedding_size`` 0 / None also means no head).

Linear init (``head_init``): ``kaiming_fan_out`` (``kaiming_normal_(mode="fan_out")``, bias 0:
Proxy-Anchor and RSW CUB/Cars), ``default`` (PyTorch's; RSW SOP, MLRC), ``glorot_uniform``
(``xavier_uniform_``, bias 0: ASAP's later code).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "CNN_POOLS",
    "TOKEN_POOLS",
    "HEADS",
    "HEAD_INITS",
    "GlobalPool",
    "build_head",
    "init_linear",
]

CNN_POOLS = ("avg", "max", "avg+max", "catavgmax")
TOKEN_POOLS = ("cls", "token_avg")
HEADS = ("linear", "layernorm_linear", "linear_layernorm", "mlp", "none")
HEAD_INITS = ("kaiming_fan_out", "default", "glorot_uniform")


class GlobalPool(nn.Module):
    """Global pooling by name; ``out_features(c)`` gives the pooled width."""

    def __init__(self, mode: str, num_prefix_tokens: int = 1) -> None:
        super().__init__()
        if mode not in CNN_POOLS + TOKEN_POOLS:
            raise ValueError(f"unknown pool {mode!r}; expected one of {CNN_POOLS + TOKEN_POOLS}")
        self.mode = mode
        self.num_prefix_tokens = int(num_prefix_tokens)

    @property
    def is_token_pool(self) -> bool:
        return self.mode in TOKEN_POOLS

    def out_features(self, channels: int) -> int:
        return 2 * channels if self.mode == "catavgmax" else channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_token_pool:
            if x.dim() != 3:
                raise ValueError(f"pool {self.mode!r} expects tokens (B, N, C), got shape {tuple(x.shape)}")
            if self.mode == "cls":
                return x[:, 0]
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        if x.dim() != 4:
            raise ValueError(f"pool {self.mode!r} expects a feature map (B, C, H, W), got shape {tuple(x.shape)}")
        if self.mode == "avg":
            return x.mean(dim=(2, 3))
        if self.mode == "max":
            return x.amax(dim=(2, 3))
        avg, mx = x.mean(dim=(2, 3)), x.amax(dim=(2, 3))
        if self.mode == "avg+max":
            return avg + mx
        return torch.cat([avg, mx], dim=1)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"


def init_linear(layer: nn.Linear, how: str) -> None:
    if how == "default":
        return
    if how == "kaiming_fan_out":
        nn.init.kaiming_normal_(layer.weight, mode="fan_out")
    elif how == "glorot_uniform":
        nn.init.xavier_uniform_(layer.weight)
    else:
        raise ValueError(f"unknown head_init {how!r}; expected one of {HEAD_INITS}")
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


def build_head(
    kind: str,
    in_features: int,
    embedding_size: int | None,
    *,
    init: str = "kaiming_fan_out",
    bias: bool = True,
    mlp_hidden: Sequence[int] = (),
) -> tuple[nn.Module, int]:
    """Return ``(head module, output width)``."""
    if kind not in HEADS:
        raise ValueError(f"unknown head {kind!r}; expected one of {HEADS}")
    if init not in HEAD_INITS:
        raise ValueError(f"unknown head_init {init!r}; expected one of {HEAD_INITS}")
    if kind == "none" or not embedding_size:
        return nn.Identity(), in_features
    d = int(embedding_size)
    if d < 0:
        raise ValueError(f"embedding_size must be >= 0, got {embedding_size}")
    if kind == "linear":
        layer = nn.Linear(in_features, d, bias=bias)
        init_linear(layer, init)
        return layer, d
    if kind == "layernorm_linear":
        layer = nn.Linear(in_features, d, bias=bias)
        init_linear(layer, init)
        return nn.Sequential(nn.LayerNorm(in_features, elementwise_affine=False), layer), d
    if kind == "linear_layernorm":
        layer = nn.Linear(in_features, d, bias=bias)
        init_linear(layer, init)
        return nn.Sequential(layer, nn.LayerNorm(d, elementwise_affine=False)), d
    # mlp: powerful-benchmarker MLP(layer_sizes=[in, *hidden, d], final_relu=False)
    sizes = [in_features, *[int(s) for s in mlp_hidden], d]
    layers: list[nn.Module] = []
    n = len(sizes) - 1
    for i in range(n):
        if i < n - 1:  # MLP(final_relu=False): a ReLU before every Linear but the last
            layers.append(nn.ReLU(inplace=False))
        lin = nn.Linear(sizes[i], sizes[i + 1], bias=bias)
        init_linear(lin, init)
        layers.append(lin)
    return nn.Sequential(*layers), d
