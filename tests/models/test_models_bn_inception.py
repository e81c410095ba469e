"""BN-Inception: Cadene's key layout, shapes, and loading through fetch -> verify -> load."""

from __future__ import annotations

import hashlib

import pytest
import torch

from dmlrepro.models import BNInception, build_model, fetch_weights, get_weight_spec

# Shapes transcribed from Cadene's pretrainedmodels/models/bninception.py (the module the
# file bn_inception-52deb4733.pth is loaded into by Proxy-Anchor / MS-loss / MLRC).
KNOWN_SHAPES = {
    "conv1_7x7_s2.weight": (64, 3, 7, 7),
    "conv1_7x7_s2.bias": (64,),
    "conv1_7x7_s2_bn.weight": (64,),
    "conv1_7x7_s2_bn.running_var": (64,),
    "conv2_3x3_reduce.weight": (64, 64, 1, 1),
    "conv2_3x3.weight": (192, 64, 3, 3),
    "inception_3a_1x1.weight": (64, 192, 1, 1),
    "inception_3a_double_3x3_1.weight": (96, 64, 3, 3),
    "inception_3a_pool_proj.weight": (32, 192, 1, 1),
    "inception_3b_pool_proj.weight": (64, 256, 1, 1),
    "inception_3c_3x3.weight": (160, 128, 3, 3),
    "inception_3c_double_3x3_2.weight": (96, 96, 3, 3),
    "inception_4a_1x1.weight": (224, 576, 1, 1),
    "inception_4d_double_3x3_reduce.weight": (160, 608, 1, 1),
    "inception_4e_double_3x3_2_bn.running_mean": (256,),
    "inception_5a_1x1.weight": (352, 1056, 1, 1),
    "inception_5b_double_3x3_2.weight": (224, 224, 3, 3),
    "inception_5b_pool_proj.weight": (128, 1024, 1, 1),
    "last_linear.weight": (1000, 1024),
    "last_linear.bias": (1000,),
}


def test_known_cadene_keys_and_shapes():
    sd = BNInception(num_classes=1000).state_dict()
    for key, shape in KNOWN_SHAPES.items():
        assert key in sd, key
        assert tuple(sd[key].shape) == shape, key
    # grid-reduction blocks (3c, 4e) have no 1x1 branch and no pool projection
    for absent in ("inception_3c_1x1.weight", "inception_3c_pool_proj.weight", "inception_4e_1x1.weight"):
        assert absent not in sd
    convs = [k for k in sd if k.endswith(".weight") and sd[k].dim() == 4]
    # 3 stem convs + 8 four-branch blocks x 7 convs (1x1, 3x3_reduce, 3x3, double_3x3_reduce,
    # double_3x3_1, double_3x3_2, pool_proj) + 2 reduction blocks x 5 convs
    assert len(convs) == 3 + 8 * 7 + 2 * 5
    assert list(sd)[:2] == ["conv1_7x7_s2.weight", "conv1_7x7_s2.bias"]
    assert "last_linear.weight" not in BNInception(num_classes=0).state_dict()


def test_feature_and_embedding_shapes():
    model = build_model(backbone="bn_inception", embedding_size=512, l2_normalize=True).eval()
    with torch.no_grad():
        assert model.forward_features(torch.zeros(1, 3, 224, 224)).shape == (1, 1024, 7, 7)
        z = model(torch.randn(1, 3, 227, 227))  # MLRC's crop also ends in a 7x7 map
        assert model.forward_features(torch.zeros(1, 3, 227, 227)).shape[-2:] == (7, 7)
    assert z.shape == (1, 512)
    assert model.feature_dim == 1024 and model.pooled_dim == 1024
    assert model.input_convention == "bgr255"
    assert model.input_config["mean"] == (104.0, 117.0, 128.0)


def test_cadene_forward_is_relu_after_every_bn():
    # Cadene's in-place ReLUs make the concatenated block outputs non-negative.
    trunk = BNInception(num_classes=0).eval()
    with torch.no_grad():
        f = trunk.forward_features(torch.randn(1, 3, 96, 96) * 50)
    assert f.min() >= 0 and f.max() > 0


def test_random_cadene_file_loads_through_fetch_verify_load(tmp_path, http_files, randomize):
    serve_dir, base_url = http_files
    spec = get_weight_spec("bn_inception.imagenet")
    assert spec.filename == "bn_inception-52deb4733.pth"

    reference = randomize(BNInception(num_classes=1000))
    state = {k: v.clone() for k, v in reference.state_dict().items() if not k.endswith("num_batches_tracked")}
    # The Caffe-ported file stores some BN tensors as (1, C) (Proxy-Anchor squeezes them).
    caffe_like = dict(state)
    for key in ("conv1_7x7_s2_bn.weight", "conv1_7x7_s2_bn.running_mean", "inception_5b_pool_proj_bn.bias"):
        caffe_like[key] = caffe_like[key].unsqueeze(0)
    path = serve_dir / spec.filename
    torch.save(caffe_like, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()

    cache = tmp_path / "cache"
    fetched = fetch_weights(spec.name, cache, url=f"{base_url}/{spec.filename}", sha256=digest)
    assert fetched == cache / spec.filename

    model = build_model(
        backbone="bn_inception",
        embedding_size=512,
        pretrained=True,
        weights_cache_dir=cache,
        weights_sha256=digest,
    )
    loaded = model.backbone.state_dict()
    assert "last_linear.weight" not in loaded
    for key, value in state.items():
        if key.startswith("last_linear."):
            continue
        assert torch.equal(loaded[key], value), key
    model.eval()
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        assert torch.allclose(model.forward_features(x), reference.eval().forward_features(x))
        assert model(x).shape == (1, 512)


def test_default_registry_hash_rejects_a_random_file(tmp_path, http_files):
    # Without an override the file-name prefix 52deb4733 is enforced.
    serve_dir, base_url = http_files
    torch.save(BNInception(num_classes=1000).state_dict(), serve_dir / "f.pth")
    from dmlrepro.models import ChecksumMismatchError

    with pytest.raises(ChecksumMismatchError, match="52deb4733"):
        fetch_weights("bn_inception.imagenet", tmp_path / "c", url=f"{base_url}/f.pth")
    assert not any((tmp_path / "c").iterdir())
