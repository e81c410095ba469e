"""``EmbeddingModel`` = trunk + global pooling + embedding head (+ optional L2 norm),
built by name from config with :func:`build_model`; BN freezing and parameter groups.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dmlrepro.config_names import loss_catalog

from .backbones import get_backbone_spec, resolve_backbone_name
from .digit_trunk import load_digit_trunk
from .heads import CNN_POOLS, TOKEN_POOLS, GlobalPool, build_head
from .weights import default_cache_dir, get_weight_spec, load_pretrained

__all__ = [
    "EmbeddingModel",
    "build_model",
    "PRESETS",
    "MODEL_KEYS",
    "model_presets",
    "freeze_batchnorm",
    "unfreeze_batchnorm",
    "parameter_groups",
]


def model_presets() -> dict[str, dict[str, Any]]:
    """Per-paper settings of pooling and head (config keys override them), as each loss's paper
    declares them (dmlrepro.losses.registry; the settings and their sources are written there).
    ``backbone`` and ``embedding_size`` are never part of a preset."""
    return {key: dict(paper["preset"]) for key, paper in loss_catalog()[1].items() if paper["preset"] is not None}


#: the presets declared when this module was imported (:func:`model_presets` reads them anew)
PRESETS: dict[str, dict[str, Any]] = model_presets()

#: Keys accepted by :func:`build_model` (a ``model:`` config section).
MODEL_KEYS = (
    "backbone",
    "preset",
    "pool",
    "head",
    "embedding_size",
    "l2_normalize",
    "head_init",
    "head_bias",
    "mlp_hidden",
    "pretrained",
    "weights_cache_dir",
    "weights_sha256",
    "digit_trunk",
    "bn_freeze",
    "backbone_kwargs",
)


class EmbeddingModel(nn.Module):
    """trunk -> :class:`GlobalPool` -> head -> (optional) L2 normalisation.

    Attributes for the data layer and the training engine: ``backbone_name``,
    ``input_config`` (``input_convention`` such as ``"rgb_imagenet"`` or ``"bgr255"``,
    ``mean``, ``std``, ``input_space``, ``input_range``), ``input_convention``,
    ``feature_dim`` (trunk width), ``pooled_dim``, ``embedding_size`` (output width).
    """

    def __init__(
        self,
        backbone: nn.Module,
        pool: GlobalPool,
        head: nn.Module,
        *,
        embedding_size: int,
        l2_normalize: bool,
        backbone_name: str = "",
        input_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.pool = pool
        self.head = head
        self.l2_normalize = bool(l2_normalize)
        self.embedding_size = int(embedding_size)
        self.feature_dim = int(backbone.num_features)
        self.pooled_dim = pool.out_features(self.feature_dim)
        self.backbone_name = backbone_name
        self.input_config = dict(input_config or {})
        self.input_convention = self.input_config.get("input_convention", "")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The trunk's output: ``(B, C, h, w)`` map or ``(B, N, C)`` tokens."""
        return self.backbone.forward_features(x)

    def forward_pooled(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.forward_features(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.head(self.forward_pooled(x))
        if self.l2_normalize:
            z = F.normalize(z, p=2.0, dim=1)
        return z

    def train(self, mode: bool = True) -> EmbeddingModel:
        super().train(mode)
        _reapply_frozen_bn(self)
        return self

    def extra_repr(self) -> str:
        return (
            f"backbone={self.backbone_name!r}, embedding_size={self.embedding_size}, l2_normalize={self.l2_normalize}"
        )


# -- build ---------------------------------------------------------------------------------
def build_model(cfg: Mapping[str, Any] | None = None, /, **kwargs: Any) -> EmbeddingModel:
    """Build an :class:`EmbeddingModel` from a config mapping and/or keyword arguments.

    Keys (keyword arguments override the mapping; a mapping with a single ``model`` key
    is unwrapped): ``backbone`` (required; see ``list_backbones()``), ``preset`` (one of
    :data:`PRESETS`), ``pool`` (default: the backbone's, ``avg`` for CNNs, ``cls`` for
    ViTs), ``head`` (``linear``), ``embedding_size`` (0/None: no head), ``l2_normalize``
    (False), ``head_init`` (``kaiming_fan_out``), ``head_bias`` (True), ``mlp_hidden``
    (``[]``), ``pretrained`` (False | True = the backbone's default weights | a weight
    name), ``weights_cache_dir`` (default ``$DMLREPRO_WEIGHTS`` or
    ``~/.cache/dmlrepro/weights``), ``weights_sha256`` (override of the expected digest),
    ``bn_freeze`` (False; True freezes running stats and affine parameters),
    ``backbone_kwargs`` (passed to the trunk builder, e.g. timm's ``drop_path_rate``).

    Unknown keys raise ``ValueError`` naming them. Pretrained weights are read from the
    cache only; a missing file raises an error naming the ``dmlrepro fetch-weights``
    command.
    """
    merged = _model_keys(cfg, kwargs)
    name = resolve_backbone_name(str(merged["backbone"]))
    spec = get_backbone_spec(name)
    pool_mode = merged.get("pool") or spec.default_pool
    allowed = TOKEN_POOLS if spec.kind == "vit" else CNN_POOLS
    if pool_mode not in allowed:
        raise ValueError(
            f"pool {pool_mode!r} does not apply to backbone {name!r} ({spec.kind}); expected one of {allowed}"
        )
    backbone_kwargs = dict(merged.get("backbone_kwargs") or {})
    trunk = spec.builder(**backbone_kwargs)
    pool = GlobalPool(pool_mode, num_prefix_tokens=getattr(trunk, "num_prefix_tokens", 1))
    pooled_dim = pool.out_features(int(trunk.num_features))

    head, out_dim = build_head(
        merged.get("head", "linear"),
        pooled_dim,
        merged.get("embedding_size"),
        init=merged.get("head_init", "kaiming_fan_out"),
        bias=bool(merged.get("head_bias", True)),
        mlp_hidden=merged.get("mlp_hidden") or (),
    )
    model = EmbeddingModel(
        trunk,
        pool,
        head,
        embedding_size=out_dim,
        l2_normalize=bool(merged.get("l2_normalize", False)),
        backbone_name=name,
        input_config=spec.input_config,
    )
    _load_weights(model, merged, spec)
    if merged.get("bn_freeze", False):
        freeze_batchnorm(model)
    return model


def _model_keys(cfg: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """build_model's keys: the mapping (a lone ``model`` key unwrapped), then the keyword arguments,
    then the preset's values for the keys still unset; unknown keys and a missing backbone raise."""
    merged: dict[str, Any] = {}
    if cfg is not None:
        if not isinstance(cfg, Mapping):
            raise TypeError(f"build_model expects a mapping, got {type(cfg).__name__}")
        if set(cfg) == {"model"} and isinstance(cfg["model"], Mapping):
            cfg = cfg["model"]
        merged.update(cfg)
    merged.update(kwargs)
    unknown = sorted(set(merged) - set(MODEL_KEYS))
    if unknown:
        raise ValueError(f"unknown model config key(s) {unknown}; expected keys among {list(MODEL_KEYS)}")
    if "backbone" not in merged:
        raise ValueError("model config needs a 'backbone' key (see dmlrepro.models.list_backbones())")
    preset_name = merged.pop("preset", None)
    if preset_name is not None:
        presets = model_presets()
        if preset_name not in presets:
            raise ValueError(f"unknown model preset {preset_name!r}; expected one of {sorted(presets)}")
        for key, value in presets[preset_name].items():
            merged.setdefault(key, value)
    return merged


def _load_weights(model: EmbeddingModel, merged: Mapping[str, Any], spec) -> None:
    """The trunk's pretrained weights (``pretrained``): the digit trunk (a local file, docs/models.md) or a
    registered weight file from the cache; nothing when false."""
    pretrained, cache = merged.get("pretrained", False), merged.get("weights_cache_dir")
    if pretrained == "digit_trunk":  # docs/models.md#the-digit-pretrained-trunk
        load_digit_trunk(
            model, merged.get("digit_trunk"), cache if cache else default_cache_dir(), merged.get("backbone_kwargs")
        )
        model.input_config["weights"] = "digit_trunk"
    elif pretrained:
        name = model.backbone_name
        weight_name = spec.default_weights if pretrained is True else str(pretrained)
        if weight_name is None:
            raise ValueError(f"backbone {name!r} has no pretrained weights; set pretrained: false")
        wspec = get_weight_spec(weight_name)
        if resolve_backbone_name(wspec.architecture) != name:
            raise ValueError(f"weights {weight_name!r} are for {wspec.architecture!r}, not backbone {name!r}")
        load_pretrained(model, weight_name, os.fspath(cache) if cache else None, sha256=merged.get("weights_sha256"))
        model.input_config["weights"] = weight_name


# -- BatchNorm freezing ------------------------------------------------------------------------
_FROZEN_ATTR = "_dmlrepro_frozen_stats"


def _bn_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _keep_eval_hook(module: nn.Module, args: tuple) -> None:
    # Guard for models that are not EmbeddingModel (whose train() cannot be overridden):
    # a frozen BN layer always runs in eval mode, whatever .train() was called.
    if getattr(module, _FROZEN_ATTR, False) and module.training:
        module.training = False


def _reapply_frozen_bn(model: nn.Module) -> None:
    for m in _bn_layers(model):
        if getattr(m, _FROZEN_ATTR, False):
            m.training = False


def freeze_batchnorm(model: nn.Module, running_stats: bool = True, affine: bool = True) -> int:
    """Freeze the BatchNorm layers of ``model``; returns how many layers were touched.

    ``running_stats=True``: the layers run in eval mode (use and never update their running
    mean/var) -- and stay so after ``model.train()``: :class:`EmbeddingModel` re-applies it
    in ``train()``, and for any other module a forward pre-hook puts the layer back in eval
    mode before every forward. ``affine=True``: ``weight``/``bias`` get
    ``requires_grad=False``. A flag that is False leaves that aspect as it is; use
    :func:`unfreeze_batchnorm` to undo (Proxy-Anchor re-enables the affine grads after
    warm-up while the statistics stay frozen: ``unfreeze_batchnorm(m, running_stats=False)``).
    """
    layers = _bn_layers(model)
    for m in layers:
        if running_stats:
            setattr(m, _FROZEN_ATTR, True)
            m.eval()
            if not getattr(m, "_dmlrepro_hooked", False):
                m.register_forward_pre_hook(_keep_eval_hook)
                m._dmlrepro_hooked = True
        if affine:
            for p in (m.weight, m.bias):
                if p is not None:
                    p.requires_grad_(False)
    return len(layers)


def unfreeze_batchnorm(model: nn.Module, running_stats: bool = True, affine: bool = True) -> int:
    """Undo :func:`freeze_batchnorm` for the chosen aspects; the layers follow
    ``model.training`` again at the next ``train()``/``eval()`` call."""
    layers = _bn_layers(model)
    for m in layers:
        if running_stats:
            setattr(m, _FROZEN_ATTR, False)
            m.training = model.training
        if affine:
            for p in (m.weight, m.bias):
                if p is not None:
                    p.requires_grad_(True)
    return len(layers)


# -- parameter groups ----------------------------------------------------------------------------
def parameter_groups(model: nn.Module, names: Sequence[str] = ("backbone", "head")) -> list[dict[str, Any]]:
    """Split the parameters into ``[{"name": "backbone", "params": [...]}, {"name": "head", ...}]``.

    ``backbone`` = the trunk; ``head`` = everything else (pooling, head). All parameters are
    listed whether or not they currently require grad (warm-up toggles ``requires_grad``
    later), each exactly once. Groups with no parameters are left out. The lists can be
    passed to a ``torch.optim`` optimizer, with the engine adding ``lr``/``weight_decay``.
    """
    trunk = getattr(model, "backbone", None)
    if trunk is None:
        raise TypeError("parameter_groups expects a model with a .backbone (an EmbeddingModel)")
    backbone_ids = {id(p) for p in trunk.parameters()}
    backbone_params = list(trunk.parameters())
    head_params = [p for p in model.parameters() if id(p) not in backbone_ids]
    groups = [{"name": names[0], "params": backbone_params}, {"name": names[1], "params": head_params}]
    return [g for g in groups if g["params"]]
