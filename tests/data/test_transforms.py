from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dmlrepro.data.corruptions import CORRUPTIONS, LEVELS, TABLE_IV, build_corruption
from dmlrepro.data.transforms import build_transform, default_resize, normalize_transform


def natural_like(h=64, w=80, seed=0) -> torch.Tensor:
    """Smooth gradients plus texture: a mid-range image every corruption visibly changes."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    a = np.stack([60 + 120 * xx / w, 60 + 120 * yy / h, 128 + 40 * np.sin(xx / 5.0)], -1)
    a += rng.normal(0, 10, a.shape)
    return torch.from_numpy(np.clip(a, 0, 255).astype(np.uint8)).permute(2, 0, 1).contiguous()


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("size, norm", [(224, "imagenet"), (227, "bninception"), (32, "none")])
def test_shapes_and_dtypes(train, size, norm):
    img = natural_like(300, 400)
    t = build_transform(train, size, normalization=norm)
    out = t(img)
    assert out.shape == (3, size, size) and out.dtype == torch.float32
    pil = Image.fromarray(img.permute(1, 2, 0).numpy())
    assert t(pil).shape == (3, size, size)


def test_imagenet_normalisation_by_hand():
    img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = normalize_transform("imagenet")(img).numpy().astype(np.float64)
    a = img.numpy().astype(np.float64) / 255.0
    exp = (a - np.array([0.485, 0.456, 0.406])[:, None, None]) / np.array([0.229, 0.224, 0.225])[:, None, None]
    np.testing.assert_allclose(out, exp, atol=1e-5)


def test_bninception_by_hand():
    img = torch.tensor(
        [[[10, 200]], [[20, 100]], [[30, 0]]], dtype=torch.uint8
    )  # (3, 1, 2): pixels (10,20,30), (200,100,0)
    out = normalize_transform("bninception")(img)
    # BGR, 0-255, minus [104, 117, 128]: pixel 1 -> (30-104, 20-117, 10-128), pixel 2 -> (0-104, 100-117, 200-128)
    exp = torch.tensor([[[-74.0, -104.0]], [[-97.0, -17.0]], [[-118.0, 72.0]]])
    assert torch.equal(out, exp)
    # through the whole eval pipeline on a uniform image: resize/crop keep the colour exactly
    flat = torch.empty(3, 40, 50, dtype=torch.uint8)
    flat[0], flat[1], flat[2] = 10, 20, 30
    full = build_transform(False, 16, normalization="bninception")(flat)
    assert full.shape == (3, 16, 16)
    assert torch.equal(full, torch.tensor([-74.0, -97.0, -118.0]).view(3, 1, 1).expand(3, 16, 16))


def test_resize_modes():
    assert default_resize(224) == 256 and default_resize(227) == 256 and default_resize(32) == 37
    # a wide image with a left/right colour split: short-side resize crops the sides away,
    # square resize squeezes them in
    img = torch.zeros(3, 100, 300, dtype=torch.uint8)
    img[0, :, :30] = 255  # a red band on the left tenth
    short = build_transform(False, 64, resize=64, normalization="none")(img)
    square = build_transform(False, 64, resize=64, resize_mode="square", normalization="none")(img)
    assert short[0].max() == 0  # the band is outside the centre crop
    assert square[0, :, :4].min() > 0.99  # the band is squeezed into the left of the crop
    sq = torch.zeros(3, 80, 80, dtype=torch.uint8)
    sq[1, 20:60, 20:60] = 200
    a = build_transform(False, 32, resize=40, normalization="none")(sq)
    b = build_transform(False, 32, resize=40, resize_mode="square", normalization="none")(sq)
    assert torch.equal(a, b)


def test_random_crop_reading_keeps_scale():
    """train_crop="random": Resize(64, square) then a plain 48-px window (possibly flipped)."""
    img = natural_like(64, 64)
    torch.manual_seed(1)
    out = build_transform(True, 48, resize=64, resize_mode="square", train_crop="random", normalization="none")(img)
    u8 = (out * 255).round().to(torch.uint8)
    windows = [img[:, i : i + 48, j : j + 48] for i in range(17) for j in range(17)]
    assert any(torch.equal(u8, w) or torch.equal(u8, w.flip(-1)) for w in windows)
    with pytest.raises(ValueError, match="train_crop"):
        build_transform(True, 48, train_crop="center")


def test_train_transform_is_random_eval_is_not():
    img = natural_like(120, 160)
    torch.manual_seed(0)
    t = build_transform(True, 32)
    assert not torch.equal(t(img), t(img))
    e = build_transform(False, 32)
    assert torch.equal(e(img), e(img))


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruptions_change_image_keep_shape(name):
    img = natural_like()
    for severity in (None, 3, 5):
        c = build_corruption(name, severity=severity, seed=1)
        out = c(img)
        assert out.shape == img.shape and out.dtype == torch.uint8
        assert torch.equal(out, c(img))  # deterministic per image
    assert not torch.equal(build_corruption(name, severity=3)(img), img)
    pil = Image.fromarray(img.permute(1, 2, 0).numpy())
    out = build_corruption(name, severity=3)(pil)
    assert isinstance(out, Image.Image) and out.size == pil.size


def test_corruption_strengths():
    grey = torch.full((3, 200, 200), 100, dtype=torch.uint8)
    sp = build_corruption("salt_and_pepper", severity=5)(grey)
    frac = (sp[0] != 100).float().mean().item()
    assert abs(frac - LEVELS["salt_and_pepper"][4]) < 0.01
    assert set(sp[0].unique().tolist()) == {0, 100, 255}
    do = build_corruption("dropout", severity=4)(grey)
    assert abs((do[0] == 0).float().mean().item() - LEVELS["dropout"][3]) < 0.01
    cut = build_corruption("cutout", severity=3)(grey)
    n = int((cut[0] == 128).sum())
    assert 0 < n <= 40 * 40  # one square of side 0.2 * 200, possibly clipped by the border
    g = build_corruption("gaussian", severity=4)(grey).float()
    assert abs(g.std().item() - LEVELS["gaussian"][3]) < 1.0
    # a blur keeps a constant image constant when its disk kernel sums to 1 (radius 3 in a 17x17
    # grid); at radius 10 the disk touches the 21x21 grid's edge and imagecorruptions' Gaussian
    # smoothing (reflect-101 border) adds ~1 % of brightness, which we reproduce
    assert torch.equal(build_corruption("defocus_blur", severity=1)(grey), grey)
    assert build_corruption("defocus_blur", severity=5)(grey).float().sub(100).abs().max() <= 1
    impulse = torch.zeros(3, 41, 41, dtype=torch.uint8)
    impulse[:, 20, 20] = 255
    spread = build_corruption("defocus_blur", severity=1)(impulse)[0]
    assert spread[20, 20] < 50 and spread[20, 22] > 0 and spread[20, 30] == 0  # a disk of radius ~3
    # jigsaw permutes cells: same pixel multiset
    img = natural_like(60, 60)
    j = build_corruption("jigsaw", severity=2)(img)
    assert torch.equal(j.flatten().sort().values, img.flatten().sort().values)


@pytest.mark.parametrize("deg", [-30.0, -10.0, 17.3, 30.0, 45.0])
def test_shear_equals_torchvisions_affine(deg):
    """Shear gathers through an index map found once per size and angle; torchvision's affine
    (nearest, fill 0) on the image itself is the reference."""
    from torchvision.transforms.v2 import functional as TF

    for h, w in ((32, 32), (48, 60), (7, 3)):
        img = natural_like(h, w)
        ours = build_corruption("shear", shear=(deg, deg))(img)
        reference = TF.affine(img, angle=0.0, translate=[0, 0], scale=1.0, shear=[deg, 0.0], fill=0)
        assert torch.equal(ours, reference)


def test_corruption_names_and_pipeline():
    assert set(TABLE_IV.values()) == set(CORRUPTIONS)
    assert build_corruption("Salt and Pepper").name == "salt_and_pepper"
    with pytest.raises(ValueError, match="unknown corruption"):
        build_corruption("fog")
    with pytest.raises(ValueError, match="severity"):
        build_corruption("gaussian", severity=7)
    t = build_transform(False, 48, corruption=build_corruption("gaussian", severity=5))
    clean = build_transform(False, 48)
    img = natural_like(100, 120)
    out = t(img)
    assert out.shape == (3, 48, 48) and out.dtype == torch.float32 and not torch.equal(out, clean(img))


def _full_pipeline(transform):
    """The v2 pipeline behind a fast path (or the transform itself)."""
    return getattr(transform, "pipeline", transform)


@pytest.mark.parametrize("norm", ["imagenet", "bninception", "none"])
@pytest.mark.parametrize("train", [True, False])
def test_square_fast_path_equals_the_v2_pipeline(train, norm):
    """At the output size (resize and crop are identities) the fast path gives the v2 pipeline's
    tensors bit for bit and leaves torch's RNG where the pipeline leaves it (the flips)."""
    t = build_transform(train, 32, resize=32, train_crop="random", normalization=norm, hflip=0.5)
    assert type(t).__name__ == "SquareFastPath"
    images = [natural_like(32, 32, seed=s) for s in range(40)]
    outs = {}
    for name, fn in (("fast", t), ("v2", _full_pipeline(t))):
        torch.manual_seed(7)
        outs[name] = torch.stack([fn(img) for img in images])
        outs[name + "_rng"] = torch.rand(4)
    assert torch.equal(outs["fast"], outs["v2"])
    assert torch.equal(outs["fast_rng"], outs["v2_rng"])
    if train:  # some flipped, some not
        torch.manual_seed(7)
        flipped = [
            not torch.equal(t(img), _full_pipeline(build_transform(False, 32, resize=32, normalization=norm))(img))
            for img in images
        ]
        assert 0 < sum(flipped) < len(flipped)


def test_fast_path_only_where_resize_and_crop_are_identities():
    assert type(build_transform(True, 32, resize=32, train_crop="rrc")).__name__ == "Compose"
    assert type(build_transform(False, 32)).__name__ == "Compose"  # eval resize 37 -> centre crop 32
    assert type(build_transform(True, 32, resize=32, train_resize=40, train_crop="random")).__name__ == "Compose"
    t = build_transform(True, 32, resize=32, train_crop="random")
    other = natural_like(40, 48)  # not at the output size: the full pipeline resizes and crops
    torch.manual_seed(0)
    a = t(other)
    torch.manual_seed(0)
    assert a.shape == (3, 32, 32) and torch.equal(a, _full_pipeline(t)(other))


def _image_folder(tmp_path, sizes):
    """A manifest of PNG images of the given sides (natural_like pixels)."""
    from dmlrepro.data.manifest import write_manifest

    paths = []
    for k, side in enumerate(sizes):
        paths.append(f"im{k}.png")
        Image.fromarray(natural_like(side, side, seed=k).permute(1, 2, 0).numpy()).save(tmp_path / paths[-1])
    return write_manifest(tmp_path / "manifest.csv", paths, [k % 3 for k in range(len(sizes))], ["train"] * len(sizes))


@pytest.mark.parametrize("norm", ["imagenet", "bninception", "none"])
@pytest.mark.parametrize("train", [True, False])
def test_batched_fetch_equals_item_by_item(tmp_path, train, norm):
    """SeededDataset.__getitems__ (the DataLoader's fetch) gives the per-item items bit for bit:
    each image's flip drawn under its own seed, the same labels and positions."""
    from dmlrepro.data import ManifestDataset
    from dmlrepro.train.run_data import SeededDataset

    manifest = _image_folder(tmp_path, [32] * 24)
    t = build_transform(train, 32, resize=32, train_crop="random", normalization=norm, hflip=0.5)
    ds = SeededDataset(ManifestDataset(manifest, transform=t, cache_images=True))
    keys = [(i, 1000 + 7 * i if train else None) for i in [3, 0, 17, 3, 9, 23, 5, 11, 2, 20, 14, 8]]
    state = torch.get_rng_state()
    batched = ds.__getitems__(keys)
    assert torch.equal(torch.get_rng_state(), state)  # torch's generator untouched, as item by item
    single = [ds[key] for key in keys]
    assert [b[1:] for b in batched] == [s[1:] for s in single]
    assert torch.equal(torch.stack([b[0] for b in batched]), torch.stack([s[0] for s in single]))
    if train:  # the batch mixes flipped and unflipped images
        plain = build_transform(False, 32, resize=32, normalization=norm)
        flipped = [not torch.equal(b[0], plain(ds.ds._image(i))) for b, (i, _) in zip(batched, keys)]
        assert 0 < sum(flipped) < len(flipped)


def test_batched_fetch_falls_back_where_the_fast_path_does_not_apply(tmp_path):
    from dmlrepro.data import ManifestDataset

    manifest = _image_folder(tmp_path, [32, 40, 32])
    t = build_transform(True, 32, resize=32, train_crop="random")
    assert (
        ManifestDataset(manifest, transform=t, cache_images=True).seeded_batch([(0, 1), (1, 2)]) is None
    )  # a 40 px image
    assert ManifestDataset(manifest, transform=t).seeded_batch([(0, 1), (2, 2)]) is None  # no cache
    rrc = build_transform(True, 32, resize=32, train_crop="rrc")
    assert ManifestDataset(manifest, transform=rrc, cache_images=True).seeded_batch([(0, 1), (2, 2)]) is None
    assert t.transform_batch([natural_like(32, 32)], [None]) is None  # a flip without a seed


@pytest.mark.parametrize("name", ["gaussian", "cutout", "jigsaw", "hue_saturation", "defocus_blur"])
def test_fast_path_with_a_corruption_equals_the_v2_pipeline(tmp_path, name):
    """RSW Table IV's corrupted test images at the output size: the fast path (item by item and
    batched) gives the v2 pipeline's tensors bit for bit."""
    from dmlrepro.data import ManifestDataset
    from dmlrepro.train.run_data import SeededDataset

    t = build_transform(False, 32, resize=32, corruption=build_corruption(name, severity=3))
    assert type(t).__name__ == "SquareFastPath"
    ds = SeededDataset(ManifestDataset(_image_folder(tmp_path, [32] * 12), transform=t, cache_images=True))
    keys = [(i, None) for i in (4, 0, 11, 4, 7)]
    reference = torch.stack([_full_pipeline(t)(ds.ds._image(i).clone()) for i, _ in keys])
    assert torch.equal(torch.stack([ds[key][0] for key in keys]), reference)
    assert torch.equal(torch.stack([item[0] for item in ds.__getitems__(keys)]), reference)
    assert not torch.equal(
        reference, torch.stack([build_transform(False, 32, resize=32)(ds.ds._image(i)) for i, _ in keys])
    )


def test_with_transform_shares_the_decoded_images(tmp_path, monkeypatch):
    from dmlrepro.data import ManifestDataset, dataset

    decoded = []
    load = dataset.load_image
    monkeypatch.setattr(dataset, "load_image", lambda path: decoded.append(path) or load(path))
    first = ManifestDataset(
        _image_folder(tmp_path, [32] * 6), transform=build_transform(False, 32, resize=32), cache_images=True
    )
    [first[i] for i in range(6)]
    other = first.with_transform(
        build_transform(False, 32, resize=32, corruption=build_corruption("gaussian", severity=3))
    )
    items = [other[i] for i in range(6)]
    assert len(decoded) == 6 and first.transform is not other.transform
    assert [item[1:] for item in items] == [first[i][1:] for i in range(6)]
