"""Models: backbones by name (timm + BN-Inception + ResNetV2-20), pooling, embedding heads, weight cache.

Entry point (timm style)::

    from dmlrepro.models import build_model
    model = build_model({"backbone": "resnet50", "pool": "avg+max", "embedding_size": 512,
                         "l2_normalize": True, "pretrained": True})

See ``docs/models.md`` for every name and option.
"""

from .backbones import (
    ALIASES,
    BACKBONES,
    BackboneSpec,
    TinyCNN,
    create_backbone,
    get_backbone_spec,
    list_backbones,
    register_backbone,
    resolve_backbone_name,
)
from .bn_inception import BNInception
from .heads import CNN_POOLS, HEAD_INITS, HEADS, TOKEN_POOLS, GlobalPool, build_head
from .model import (
    MODEL_KEYS,
    PRESETS,
    EmbeddingModel,
    build_model,
    freeze_batchnorm,
    parameter_groups,
    unfreeze_batchnorm,
)
from .resnet_v2 import ResNet20V2
from .weights import (
    WEIGHTS,
    ChecksumMismatchError,
    WeightsError,
    WeightsNotCachedError,
    WeightSpec,
    default_cache_dir,
    fetch_command,
    fetch_weights,
    get_weight_spec,
    list_weights,
    load_pretrained,
    weight_path,
)

__all__ = [
    "ALIASES",
    "BACKBONES",
    "BackboneSpec",
    "TinyCNN",
    "create_backbone",
    "get_backbone_spec",
    "list_backbones",
    "register_backbone",
    "resolve_backbone_name",
    "BNInception",
    "ResNet20V2",
    "CNN_POOLS",
    "TOKEN_POOLS",
    "HEADS",
    "HEAD_INITS",
    "GlobalPool",
    "build_head",
    "MODEL_KEYS",
    "PRESETS",
    "EmbeddingModel",
    "build_model",
    "freeze_batchnorm",
    "unfreeze_batchnorm",
    "parameter_groups",
    "WEIGHTS",
    "WeightSpec",
    "WeightsError",
    "ChecksumMismatchError",
    "WeightsNotCachedError",
    "default_cache_dir",
    "fetch_command",
    "fetch_weights",
    "get_weight_spec",
    "list_weights",
    "load_pretrained",
    "weight_path",
]
