"""The images of a small dataset decoded once at preparation (dmlrepro.data.decoded): the decoder's
bytes, image by image; none for a dataset over the size limit."""

import numpy as np
import torch
from PIL import Image

from dmlrepro.data import decoded
from dmlrepro.data.dataset import load_image
from dmlrepro.data.prepared import finalize, new_staging


def _prepare(root, sides):
    staging = new_staging(root / "small")
    paths = []
    for k, (h, w) in enumerate(sides):
        paths.append(f"{k}.png")
        Image.fromarray(np.random.default_rng(k).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(staging / paths[-1])
    finalize(root / "small", staging, paths, [k % 2 for k in range(len(sides))], ["train"] * len(sides))
    return root / "small", paths


def test_preparation_stores_the_decoded_images(tmp_path):
    folder, paths = _prepare(tmp_path, [(8, 12), (10, 10), (5, 7)])
    stored = decoded.read_decoded(folder)
    assert list(stored) == paths
    for p in paths:
        assert torch.equal(torch.from_numpy(stored[p].copy()), load_image(folder / p))


def test_no_store_over_the_limit_or_when_it_does_not_add_up(tmp_path, monkeypatch):
    monkeypatch.setattr(decoded, "MAX_MB", 3 * 8 * 12 / 2**20)  # less than the images' bytes
    folder, _ = _prepare(tmp_path, [(8, 12), (10, 10)])
    assert not (folder / decoded.DECODED_NAME).exists() and decoded.read_decoded(folder) == {}
    np.savez(
        folder / decoded.DECODED_NAME,
        pixels=np.zeros(10, np.uint8),
        paths=np.asarray(["0.png"]),
        heights=np.asarray([8]),
        widths=np.asarray([12]),
    )  # 10 bytes for a 288-byte image
    assert decoded.read_decoded(folder) == {}
