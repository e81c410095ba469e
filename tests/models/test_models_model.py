"""build_model: every backbone by name, pooling, heads, L2 switch, BN freezing, param groups."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dmlrepro.models import (
    PRESETS,
    GlobalPool,
    build_model,
    freeze_batchnorm,
    list_backbones,
    parameter_groups,
    resolve_backbone_name,
    unfreeze_batchnorm,
)

# name -> (trunk width from the architecture papers / timm docs, input px for a cheap test)
EXPECTED = {
    "resnet50": (2048, 64),
    "bn_inception": (1024, 96),
    "vit_small_patch16_224": (384, 224),
    "dino_vits16": (384, 224),
    "resnet18": (512, 32),
    "resnet10t": (512, 32),
    "mobilenetv3_small_100": (576, 32),
    "tiny_cnn": (128, 32),
    "resnetv2_20": (256, 32),
}


def test_registry_matches_the_expected_list():
    assert sorted(EXPECTED) == list_backbones()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_backbone_builds_by_name_with_the_right_shapes(name):
    width, px = EXPECTED[name]
    batch = 1 if "vit" in name else 2
    model = build_model({"backbone": name, "embedding_size": 24, "l2_normalize": True}).eval()
    assert model.feature_dim == width
    with torch.no_grad():
        z = model(torch.randn(batch, 3, px, px))
    assert z.shape == (batch, 24)
    assert torch.allclose(z.norm(dim=1), torch.ones(batch), atol=1e-5)
    headless = build_model(backbone=name, embedding_size=0)
    assert headless.embedding_size == width and isinstance(headless.head, nn.Identity)


def test_aliases_from_the_specs():
    assert resolve_backbone_name("vit_s16") == "vit_small_patch16_224"
    assert resolve_backbone_name("dino_vit_s16") == "dino_vits16"
    assert resolve_backbone_name("bninception") == "bn_inception"
    with pytest.raises(KeyError, match="unknown backbone 'resnet51'"):
        build_model(backbone="resnet51")


def test_vit_cls_pooling_equals_timms_token_pooling():
    import copy

    model = build_model(backbone="dino_vits16", embedding_size=0).eval()
    oracle = copy.deepcopy(model.backbone)
    oracle.reset_classifier(0, global_pool="token")  # timm's own class-token pooling
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(model(x), oracle.eval()(x), atol=1e-5)
        tokens = model.forward_features(x)
    assert tokens.shape == (1, 197, 384)
    assert torch.allclose(GlobalPool("token_avg")(tokens), tokens[:, 1:].sum(dim=1) / 196, atol=1e-6)


@pytest.mark.parametrize("mode", ["avg", "max", "avg+max", "catavgmax"])
def test_cnn_pooling_against_torch_adaptive_pools(mode):
    x = torch.randn(3, 5, 4, 6, dtype=torch.float64)
    gap = nn.AdaptiveAvgPool2d(1)(x).flatten(1)
    gmp = nn.AdaptiveMaxPool2d(1)(x).flatten(1)
    expected = {"avg": gap, "max": gmp, "avg+max": gap + gmp, "catavgmax": torch.cat([gap, gmp], 1)}[mode]
    pool = GlobalPool(mode)
    assert torch.allclose(pool(x), expected)
    assert pool.out_features(5) == expected.shape[1]

    model = build_model(backbone="tiny_cnn", pool=mode, embedding_size=0).eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fmap = model.forward_features(images)
        fg, fm = fmap.mean(dim=(2, 3)), fmap.flatten(2).max(dim=2).values
        want = {"avg": fg, "max": fm, "avg+max": fg + fm, "catavgmax": torch.cat([fg, fm], 1)}[mode]
        assert torch.allclose(model(images), want, atol=1e-6)


def test_pool_must_fit_the_backbone_kind():
    with pytest.raises(ValueError, match="does not apply"):
        build_model(backbone="dino_vits16", pool="avg+max")
    with pytest.raises(ValueError, match="does not apply"):
        build_model(backbone="tiny_cnn", pool="cls")


def test_l2_switch():
    torch.manual_seed(3)
    raw = build_model(backbone="tiny_cnn", embedding_size=16, l2_normalize=False).eval()
    normed = build_model(backbone="tiny_cnn", embedding_size=16, l2_normalize=True).eval()
    normed.load_state_dict(raw.state_dict())
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        a, b = raw(x), normed(x)
    assert not torch.allclose(a.norm(dim=1), torch.ones(4), atol=1e-3)
    assert torch.allclose(b.norm(dim=1), torch.ones(4), atol=1e-6)
    assert torch.allclose(b, a / a.norm(dim=1, keepdim=True), atol=1e-6)


def test_linear_head_kaiming_fan_out_init_like_proxy_anchor():
    torch.manual_seed(0)
    model = build_model(backbone="tiny_cnn", pool="avg+max", embedding_size=512, head="linear")
    w, b = model.head.weight, model.head.bias
    assert w.shape == (512, 128)
    assert torch.count_nonzero(b) == 0
    # kaiming_normal_(mode="fan_out"): std = sqrt(2 / fan_out) = sqrt(2/512) = 0.0625
    assert abs(w.std().item() - math.sqrt(2 / 512)) < 0.003


def test_rsw_preset_layernorm_head_matches_manual_computation():
    model = build_model(backbone="tiny_cnn", preset="rsw", embedding_size=32).eval()
    assert model.pool.mode == "avg+max" and not model.l2_normalize
    layer_norm, linear = model.head
    assert isinstance(layer_norm, nn.LayerNorm) and layer_norm.weight is None and layer_norm.bias is None
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        pooled = model.forward_pooled(x).double()
        mean = pooled.mean(dim=1, keepdim=True)
        var = pooled.var(dim=1, unbiased=False, keepdim=True)
        normed = (pooled - mean) / torch.sqrt(var + 1e-5)
        expected = normed @ linear.weight.double().t() + linear.bias.double()
        assert torch.allclose(model(x).double(), expected, atol=1e-4)


def test_hist_preset_linear_then_layernorm_matches_manual_computation():
    model = build_model(backbone="tiny_cnn", preset="hist", embedding_size=32).eval()
    assert model.pool.mode == "avg+max" and not model.l2_normalize
    linear, layer_norm = model.head
    assert isinstance(layer_norm, nn.LayerNorm) and layer_norm.weight is None and layer_norm.normalized_shape == (32,)
    assert torch.count_nonzero(linear.bias) == 0
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        z = model.forward_pooled(x).double() @ linear.weight.double().t()
        expected = (z - z.mean(dim=1, keepdim=True)) / torch.sqrt(z.var(dim=1, unbiased=False, keepdim=True) + 1e-5)
        assert torch.allclose(model(x).double(), expected, atol=1e-4)


def test_asap_and_mlrc_heads():
    asap = build_model(backbone="tiny_cnn", preset="asap", embedding_size=64)
    assert isinstance(asap.head, nn.Linear) and asap.head.bias is None
    bound = math.sqrt(6 / (128 + 64))  # xavier_uniform_ bound
    assert asap.head.weight.abs().max() <= bound and asap.head.weight.abs().max() > 0.9 * bound
    assert asap.pool.mode == "avg"

    mlrc = build_model(backbone="bn_inception", preset="mlrc", embedding_size=128)
    assert [type(m) for m in mlrc.head] == [nn.Linear]  # MLP([1024, 128]) is a single Linear
    assert mlrc.head[0].in_features == 1024 and mlrc.embedding_size == 128
    deeper = build_model(backbone="tiny_cnn", head="mlp", mlp_hidden=[64], embedding_size=16)
    # powerful-benchmarker MLP([128, 64, 16], final_relu=False): ReLU, Linear, Linear
    assert [type(m) for m in deeper.head] == [nn.ReLU, nn.Linear, nn.Linear]


def test_presets_only_use_known_keys_and_bad_keys_fail_early():
    for preset in PRESETS:
        build_model(backbone="tiny_cnn", preset=preset, embedding_size=8)
    with pytest.raises(ValueError, match="embeding_size"):
        build_model(backbone="tiny_cnn", embeding_size=8)
    with pytest.raises(ValueError, match="unknown model preset"):
        build_model(backbone="tiny_cnn", preset="nope")
    # a {"model": {...}} config section is unwrapped
    assert build_model({"model": {"backbone": "tiny_cnn", "embedding_size": 5}}).embedding_size == 5


def _bn_state(model):
    return {
        n: (m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone())
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    }


def _assert_bn_state_equal(a, b):
    assert a.keys() == b.keys() and a
    for k in a:
        for x, y in zip(a[k], b[k]):
            assert torch.equal(x, y), k


def test_frozen_bn_stats_unchanged_after_train_mode_forward():
    model = build_model(backbone="tiny_cnn", embedding_size=8)
    n = freeze_batchnorm(model)
    assert n == 4
    before = _bn_state(model)
    model.train()  # must not un-freeze
    assert all(not m.training for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    assert model.head.training
    model(torch.randn(8, 3, 32, 32) * 3 + 1).sum().backward()
    _assert_bn_state_equal(before, _bn_state(model))
    bn = model.backbone.features[1]
    assert not bn.weight.requires_grad and bn.weight.grad is None
    assert model.backbone.features[0].weight.grad is not None  # the convs still train

    # control: without freezing, the same forward does change the statistics
    unfreeze_batchnorm(model)
    model.train()
    model(torch.randn(8, 3, 32, 32) * 3 + 1)
    after = _bn_state(model)
    assert not torch.equal(after["backbone.features.1"][0], before["backbone.features.1"][0])
    assert bn.weight.requires_grad


def test_freeze_stats_only_keeps_affine_trainable_and_works_on_plain_modules():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    freeze_batchnorm(net, running_stats=True, affine=False)
    before = net[1].running_mean.clone()
    net.train()  # a plain Sequential: the forward pre-hook keeps the layer in eval mode
    net(torch.randn(4, 3, 8, 8) + 2)
    assert torch.equal(net[1].running_mean, before)
    assert net[1].weight.requires_grad


def test_build_model_bn_freeze_key():
    model = build_model(backbone="resnet10t", embedding_size=8, bn_freeze=True).train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(not m.training and not m.weight.requires_grad for m in bns)


@pytest.mark.parametrize(
    "head,size", [("linear", 16), ("layernorm_linear", 16), ("linear_layernorm", 16), ("mlp", 16), ("none", 0)]
)
def test_parameter_groups_partition_the_parameters(head, size):
    model = build_model(backbone="tiny_cnn", head=head, embedding_size=size, mlp_hidden=[32] if head == "mlp" else [])
    freeze_batchnorm(model)  # frozen parameters are still listed
    groups = parameter_groups(model)
    by_name = {g["name"]: g["params"] for g in groups}
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids))  # disjoint
    assert set(ids) == {id(p) for p in model.parameters()}  # complete
    assert {id(p) for p in by_name["backbone"]} == {id(p) for p in model.backbone.parameters()}
    if size:
        assert {id(p) for p in by_name["head"]} == {id(p) for p in model.head.parameters()}
    else:
        assert "head" not in by_name
    torch.optim.SGD([{**g, "lr": 0.1 if g["name"] == "head" else 0.01} for g in groups], lr=0.01)
