"""The device-side data path: the CPU path's crops, flips and pixels (on the CPU), clear failures without CUDA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from dmlrepro.data.dataset import load_image
from dmlrepro.data.device_pipeline import DevicePipeline, decode_batch
from dmlrepro.data.transforms import build_transform


def natural_like(h, w, seed):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    a = np.stack([60 + 120 * xx / w, 60 + 120 * yy / h, 128 + 40 * np.sin(xx / 5.0)], -1) + rng.normal(0, 10, (h, w, 3))
    return np.clip(a, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """Six JPEG files of different sizes and aspect ratios (4:2:0, quality 90), with their bytes."""
    folder = tmp_path_factory.mktemp("jpegs")
    files = []
    for k, (h, w) in enumerate([(300, 400), (240, 320), (257, 256), (330, 250), (230, 240), (260, 300)]):
        path = folder / f"{k}.jpg"
        Image.fromarray(natural_like(h, w, k)).save(path, quality=90)
        files.append(path)
    return files, [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in files]


def cpu_path(files, seeds, **kwargs):
    """What the data layer does: decode the file, then the transform under torch's generator seeded per image."""
    transform, out = build_transform(**kwargs), []
    for path, seed in zip(files, seeds):
        saved = torch.default_generator.get_state()
        if seed is not None:
            torch.default_generator.manual_seed(seed)
        out.append(transform(load_image(path)))
        torch.default_generator.set_state(saved)
    return torch.stack(out)


CASES = {
    "pfml train": dict(train=True, size=224),
    "asap train": dict(train=True, size=227, train_resize=256, scale=(0.16, 1.0), normalization="bninception"),
    "rsw random crop": dict(train=True, size=224, train_crop="random", resize_mode="square"),
    "eval": dict(train=False, size=224),
    "eval bninception square": dict(train=False, size=227, resize_mode="square", normalization="bninception"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_the_cpu_path_bit_for_bit_on_the_cpu(jpegs, case):
    files, encoded = jpegs
    kwargs = CASES[case]
    seeds = [1234 + 7 * k for k in range(len(files))] if kwargs["train"] else [None] * len(files)
    expected = cpu_path(files, seeds, **kwargs)
    got = DevicePipeline(**kwargs, device="cpu")(encoded, seeds)
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert torch.equal(got, expected)


def test_crops_and_flips_follow_the_seeds_not_the_callers_generator(jpegs):
    files, encoded = jpegs
    pipeline = DevicePipeline(True, 64, device="cpu")
    before = torch.get_rng_state()
    draws = [pipeline.draw(480, 640, seed) for seed in range(200)]
    assert torch.equal(torch.get_rng_state(), before)  # the caller's stream is untouched
    assert draws == [pipeline.draw(480, 640, seed) for seed in range(200)]
    flips = sum(d[4] for d in draws)
    assert 70 < flips < 130  # p = 0.5
    assert len({d[:4] for d in draws}) > 190  # the crops vary with the seed


def test_a_file_nvjpeg_rejects_is_decoded_the_data_layers_way(jpegs, tmp_path):
    files, encoded = jpegs
    png = tmp_path / "x.png"
    Image.fromarray(natural_like(50, 70, 9)).save(png)
    batch = [encoded[0], torch.frombuffer(bytearray(png.read_bytes()), dtype=torch.uint8)]
    images = decode_batch(batch, torch.device("cpu"))
    assert torch.equal(images[0], load_image(files[0])) and torch.equal(images[1], load_image(png))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_one_clear_line():
    with pytest.raises(ValueError, match="torch sees no CUDA GPU; decode on the CPU"):
        DevicePipeline(True, 224, device="cuda")


def test_training_needs_a_seed_per_image(jpegs):
    _, encoded = jpegs
    with pytest.raises(ValueError, match="needs a seed per image"):
        DevicePipeline(True, 32, device="cpu")(encoded[:2], [1, None])
