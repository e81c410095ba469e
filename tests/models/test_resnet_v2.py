"""ResNetV2-20 (ASAP's MNIST trunk) against the authors' ccp-dml ``CifarResNet`` as written.

The reference below is transcribed from yetigurbuz/ccp-dml ``framework/models/backbones/resnets.py``
(``CifarResNet`` with its defaults stages=3, blocks=2) and ``framework/layers/residual.py``
(``resMap``, ``resBlock``, ``resnetBlock``), using only ``torch.nn.functional`` and the module's
parameters read by name.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dmlrepro.models import ResNet20V2, build_model, get_backbone_spec, list_backbones, resolve_backbone_name

EPS = 1e-3  # Keras BatchNormalization default epsilon


def _randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """float64, eval mode, BN statistics/affine and the stem bias drawn at random (signed, so that
    every ReLU and every bias matters); the conv kernels keep their Glorot init."""
    g = torch.Generator().manual_seed(seed)
    model = model.double().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g, dtype=torch.float64) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g, dtype=torch.float64) * 0.5)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g, dtype=torch.float64) * 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g, dtype=torch.float64) * 0.2 + 0.02)
        model.stem.bias.copy_(torch.randn(model.stem.bias.shape, generator=g, dtype=torch.float64))
    return model


def _bn(sd, name, x):
    return F.batch_norm(
        x,
        sd[f"{name}.running_mean"],
        sd[f"{name}.running_var"],
        sd[f"{name}.weight"],
        sd[f"{name}.bias"],
        training=False,
        eps=EPS,
    )


def _conv(sd, name, x, cout, k, stride=1):
    w = sd[f"{name}.weight"]
    assert tuple(w.shape) == (cout, x.shape[1], k, k), name  # widths as ccp-dml derives them
    return F.conv2d(x, w, sd.get(f"{name}.bias"), stride=stride, padding=k // 2)


def _reference_features(sd, x):
    """ccp-dml CifarResNet(stages=3, blocks=2, block_repeats=1, final_activation=True)."""
    in_dim = 16
    x = F.relu(_bn(sd, "stem_bn", _conv(sd, "stem", x, in_dim, 3)))  # Conv2D(16, 3, 'same'), BN, ReLU
    index = 0
    for stage in range(3):
        for res_block in range(2):
            pre_activation, spatial_decimation, out_dim_reduction_rate = True, 1, 2
            if stage == 0:
                out_dim, out_dim_reduction_rate = in_dim * 4, 4
                if res_block == 0:
                    pre_activation = False
            else:
                out_dim = in_dim * 2
                if res_block == 0:
                    spatial_decimation = 2
            if res_block != 0:  # resBlock(out_dim_reduction_rate=2), stride 1, identity shortcut
                out_dim_reduction_rate, spatial_decimation = 2, 1
            reduced = out_dim // out_dim_reduction_rate
            p = f"blocks.{index}"
            # resnetBlock: pre-activation, 1x1 (strided), BN-ReLU, 3x3, BN-ReLU, 1x1
            g = F.relu(_bn(sd, f"{p}.bn1", x)) if pre_activation else x
            g = _conv(sd, f"{p}.conv1", g, reduced, 1, spatial_decimation)
            g = _conv(sd, f"{p}.conv2", F.relu(_bn(sd, f"{p}.bn2", g)), reduced, 3)
            g = _conv(sd, f"{p}.conv3", F.relu(_bn(sd, f"{p}.bn3", g)), out_dim, 1)
            # resMap: linear_map(x) (1x1, strided, on the un-activated x) + g; resBlock: x + g
            x = (_conv(sd, f"{p}.shortcut", x, out_dim, 1, spatial_decimation) if res_block == 0 else x) + g
            index += 1
        in_dim = out_dim
    return F.relu(_bn(sd, "final_bn", x))  # v2 has BN-ReLU before pooling


@pytest.mark.parametrize("px", [28, 32])
def test_forward_equals_a_functional_transcription_of_the_authors_code(px):
    model = _randomized(ResNet20V2())
    sd = model.state_dict()
    x = torch.randn(3, 3, px, px, dtype=torch.float64)
    with torch.no_grad():
        want = _reference_features(sd, x)
        assert torch.allclose(model.forward_features(x), want, rtol=1e-10, atol=1e-12)
        assert torch.allclose(model(x), want.mean(dim=(2, 3)), rtol=1e-10, atol=1e-12)
    assert want.abs().max() > 0.1 and (want == 0).any()  # non-trivial, the last ReLU clips


def test_blocks_are_pre_activation_with_projection_shortcuts_where_the_shape_changes():
    model = _randomized(ResNet20V2(), seed=1)
    relu = F.relu
    projections = []
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            cin = block.conv1.in_channels
            x = torch.randn(2, cin, 9, 9, dtype=torch.float64)  # odd size: strided 1x1 convs give ceil(9 / 2)
            h = x if i == 0 else relu(block.bn1(x))  # the first block's input is the stem's BN-ReLU
            h = block.conv3(relu(block.bn3(block.conv2(relu(block.bn2(block.conv1(h)))))))
            shape_changes = block.conv3.out_channels != cin or block.conv1.stride != (1, 1)
            if shape_changes:
                projections.append(i)
                shortcut = F.conv2d(x, block.shortcut.weight, stride=block.conv1.stride)  # of x, not of bn1(x)
                assert block.shortcut.kernel_size == (1, 1) and block.shortcut.bias is None
            else:
                assert block.shortcut is None
                shortcut = x
            assert torch.allclose(block(x), shortcut + h, rtol=1e-10, atol=1e-12), i
    assert projections == [0, 2, 4]
    assert model.blocks[0].bn1 is None and all(b.bn1 is not None for b in model.blocks[1:])
    assert [model.blocks[i].conv1.stride for i in range(6)] == [(1, 1), (1, 1), (2, 2), (1, 1), (2, 2), (1, 1)]
    assert tuple(model.blocks[2](torch.zeros(1, 64, 9, 9, dtype=torch.float64)).shape) == (1, 128, 5, 5)


def test_parameter_count_and_depth_by_hand():
    model = ResNet20V2()

    def conv(cin, cout, k, bias=False):
        return cin * cout * k * k + (cout if bias else 0)

    def bn(c):
        return 2 * c  # gamma, beta (running statistics are buffers)

    stem = conv(3, 16, 3, bias=True) + bn(16)  # 432 + 16 + 32 = 480
    # stage 0: block 0 (no pre-activation, projection 16 -> 64), block 1 (mid 64 // 2 = 32)
    s0 = (
        conv(16, 16, 1)
        + bn(16)
        + conv(16, 16, 3)
        + bn(16)
        + conv(16, 64, 1)
        + conv(16, 64, 1)  # 4672
        + bn(64)
        + conv(64, 32, 1)
        + bn(32)
        + conv(32, 32, 3)
        + bn(32)
        + conv(32, 64, 1)
    )  # 13568
    s1 = (
        bn(64)
        + conv(64, 64, 1)
        + bn(64)
        + conv(64, 64, 3)
        + bn(64)
        + conv(64, 128, 1)
        + conv(64, 128, 1)  # 57728
        + bn(128)
        + conv(128, 64, 1)
        + bn(64)
        + conv(64, 64, 3)
        + bn(64)
        + conv(64, 128, 1)
    )  # 53760
    s2 = (
        bn(128)
        + conv(128, 128, 1)
        + bn(128)
        + conv(128, 128, 3)
        + bn(128)
        + conv(128, 256, 1)
        + conv(128, 256, 1)  # 230144
        + bn(256)
        + conv(256, 128, 1)
        + bn(128)
        + conv(128, 128, 3)
        + bn(128)
        + conv(128, 256, 1)
    )  # 214016
    final = bn(256)  # 512
    assert (stem, s0, s1, s2, final) == (480, 4672 + 13568, 57728 + 53760, 230144 + 214016, 512)
    assert sum(p.numel() for p in model.parameters()) == stem + s0 + s1 + s2 + final == 574_880

    convs = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    main_path = [n for n, _ in convs if not n.endswith("shortcut")]
    assert len(main_path) == 1 + 3 * 2 * 3 == 19  # stem + 3 stages x 2 blocks x 3 convs
    assert len(convs) - len(main_path) == 3  # projection shortcuts, not counted (He et al.)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 1 + 5 * 3 + 2 + 1
    # the "20" of ResNetV2-20 (Keras: depth = 9n + 2, n = 2): 19 convs + ASAP's fully connected layer
    full = build_model(backbone="resnetv2_20", preset="asap", embedding_size=2)
    linears = [m for m in full.modules() if isinstance(m, nn.Linear)]
    assert len(main_path) + len(linears) == 9 * 2 + 2 == 20


def test_keras_default_init_and_batchnorm_settings():
    model = ResNet20V2()
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):  # glorot_uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out))
            k = m.kernel_size[0] * m.kernel_size[1]
            bound = math.sqrt(6 / (k * m.in_channels + k * m.out_channels))
            assert m.weight.abs().max() <= bound and m.weight.abs().max() > 0.8 * bound, name
        if isinstance(m, nn.BatchNorm2d):  # Keras momentum 0.99 = PyTorch 0.01, epsilon 1e-3
            assert (m.eps, m.momentum) == (1e-3, 0.01), name
    assert torch.count_nonzero(model.stem.bias) == 0


@pytest.mark.parametrize("px,side", [(28, 7), (32, 8), (8, 2)])
def test_shapes_and_gradients_reach_the_stem(px, side):
    model = ResNet20V2().train()
    x = torch.randn(4, 3, px, px)
    fmap = model.forward_features(x)
    assert fmap.shape == (4, 256, side, side) and model.num_features == 256
    out = model(x)
    assert out.shape == (4, 256)
    assert torch.allclose(out, fmap.mean(dim=(2, 3)), atol=1e-6)
    out.pow(2).sum().backward()
    grad = model.stem.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_reachable_by_name_and_through_the_model_builder_with_a_2d_head():
    assert "resnetv2_20" in list_backbones()
    assert resolve_backbone_name("resnet_v2_20") == resolve_backbone_name("resnet20v2") == "resnetv2_20"
    spec = get_backbone_spec("resnet_v2_20")
    assert (spec.kind, spec.default_pool, spec.default_weights) == ("cnn", "avg", None)
    assert spec.input_config["input_convention"] == "rgb_half"

    # as the c2_asap_2d method builds its model, with this trunk
    model = build_model(
        {"model": {"backbone": "resnetv2_20", "preset": "asap", "embedding_size": 2, "l2_normalize": False}}
    )
    assert isinstance(model.backbone, ResNet20V2) and model.input_convention == "rgb_half"
    assert isinstance(model.head, nn.Linear) and model.head.weight.shape == (2, 256) and model.head.bias is None
    x = torch.randn(6, 3, 28, 28)
    z = model.train()(x)
    assert z.shape == (6, 2)
    z.pow(2).sum().backward()
    assert model.backbone.stem.weight.grad.abs().sum() > 0 and model.head.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(x), model.backbone(x) @ model.head.weight.t(), atol=1e-6)

    grey = build_model(backbone="resnetv2_20", embedding_size=2, backbone_kwargs={"in_chans": 1, "bn_momentum": 0.1})
    assert grey.backbone.stem.in_channels == 1 and grey.backbone.final_bn.momentum == 0.1
    assert grey.eval()(torch.randn(2, 1, 28, 28)).shape == (2, 2)
    with pytest.raises(ValueError, match="no pretrained weights"):
        build_model(backbone="resnetv2_20", embedding_size=2, pretrained=True)
