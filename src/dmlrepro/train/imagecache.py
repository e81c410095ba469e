"""One decoded-image cache per run, shared by the main process and every DataLoader worker.

With ``dataset.cache_images: true`` the data layer keeps each decoded image after its first read,
in a dict of its own process: every worker of every loader decodes and holds its own copy.
:func:`share_image_cache` replaces that dict, for every dataset of the run, by a view of one
:class:`SharedImageCache`: a flat uint8 tensor in shared memory with one slot per manifest row
(sized from the image sizes recorded at preparation, ``image_sizes.csv``, or else from the image
headers), filled on first read by whichever process reads the image and read by all others. The
bytes are those of the decoder, so results do not change. Only when the images fit
``speed.image_cache_mb``; otherwise each process keeps its own cache, as before.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from PIL import Image

from dmlrepro.data.decoded import DECODED_NAME, read_decoded
from dmlrepro.data.prepared import read_image_sizes


def image_shapes(root: str, paths: list[str], budget_mb: float) -> list[tuple[int, int]] | None:
    """(height, width) of each image: as recorded at preparation, else from its header (no
    decoding); None as soon as their decoded RGB bytes exceed `budget_mb` (no more headers read)."""
    recorded = read_image_sizes(root)
    shapes, nbytes = [], 0
    for p in paths:
        shape = recorded.get(p) or _header_shape(os.path.join(root, p))
        nbytes += 3 * shape[0] * shape[1]
        if nbytes / 2**20 > budget_mb:
            return None
        shapes.append(shape)
    return shapes


def _header_shape(path: str) -> tuple[int, int]:
    with Image.open(path) as im:
        w, h = im.size
    return h, w


class SharedImageCache:
    """Decoded RGB images (3, H, W) of manifest rows in one shared uint8 buffer."""

    def __init__(self, rows: np.ndarray, shapes: list[tuple[int, int]]):
        self.slot = {int(r): k for k, r in enumerate(rows)}
        sizes = np.asarray([3 * h * w for h, w in shapes], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])
        self.shapes = shapes
        # created in shared memory (not allocated, then copied there: seconds per GiB)
        storage = torch.UntypedStorage._new_shared(int(self.offsets[-1]))
        self.data = torch.empty(0, dtype=torch.uint8).set_(storage)
        self.filled = torch.zeros(len(rows), dtype=torch.uint8).share_memory_()

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])

    def get(self, row: int) -> torch.Tensor | None:
        k = self.slot.get(int(row))
        if k is None or not self.filled[k]:
            return None
        h, w = self.shapes[k]
        return self.data[self.offsets[k] : self.offsets[k + 1]].view(3, h, w)

    def put(self, row: int, img: torch.Tensor) -> bool:
        """Store `img` in its row's slot (False: no slot of that shape; the caller keeps it)."""
        k = self.slot.get(int(row))
        if k is None or tuple(img.shape) != (3, *self.shapes[k]) or img.dtype != torch.uint8:
            return False
        self.data[self.offsets[k] : self.offsets[k + 1]].copy_(img.reshape(-1))
        self.filled[k] = 1  # after the bytes: a reader that sees the flag sees the image
        return True

    def fill_from(self, root: str, paths: list[str]) -> int:
        """Fill the slots (``paths``: each slot's image) from the images decoded at preparation
        (``dmlrepro.data.decoded``), if the folder has them; the number of slots filled."""
        store = read_decoded(root)
        filled = 0
        for k, p in enumerate(paths):
            img = store.get(p)
            if img is not None and img.shape[1:] == tuple(self.shapes[k]):
                self.data[self.offsets[k] : self.offsets[k + 1]].copy_(torch.from_numpy(img.reshape(-1)))
                self.filled[k] = 1
                filled += 1
        return filled

    def view(self, ds_rows: np.ndarray) -> _CacheView:
        return _CacheView(self, np.asarray(ds_rows, dtype=np.int64))


class _CacheView:
    """What a ManifestDataset's per-process cache dict becomes: position i -> its row's slot."""

    def __init__(self, cache: SharedImageCache, rows: np.ndarray):
        self.cache, self.rows = cache, rows
        self.own: dict[int, torch.Tensor] = {}  # images without a slot of their shape

    def __contains__(self, i: int) -> bool:
        return i in self.own or self.cache.get(self.rows[i]) is not None

    def __getitem__(self, i: int) -> torch.Tensor:
        img = self.cache.get(self.rows[i])
        return self.own[i] if img is None else img

    def __setitem__(self, i: int, img: torch.Tensor) -> None:
        if not self.cache.put(self.rows[i], img):
            self.own[i] = img


def share_image_cache(datasets: list[Any], budget_mb: float, say=print) -> SharedImageCache | None:
    """One shared cache for the rows of `datasets` that cache images (``_cache`` not None), if
    their decoded size fits `budget_mb`; each such dataset's cache becomes a view of it."""
    cached = [ds for ds in datasets if ds is not None and getattr(ds, "_cache", None) is not None]
    if not cached:
        return None
    paths: dict[int, str] = {}
    for ds in cached:
        paths.update(zip(map(int, ds.rows), ds.paths))
    rows = np.asarray(sorted(paths), dtype=np.int64)
    shapes = image_shapes(cached[0].root, [paths[int(r)] for r in rows], budget_mb)
    if shapes is None:
        say(
            f"image cache: {len(rows)} images need more than speed.image_cache_mb = {budget_mb:g} MiB; "
            f"each process caches its own"
        )
        return None
    cache = SharedImageCache(rows, shapes)
    need_mb = cache.nbytes / 2**20
    for ds in cached:
        ds._cache = cache.view(ds.rows)
    stored = cache.fill_from(cached[0].root, [paths[int(r)] for r in rows])
    say(
        f"image cache: {len(rows)} images, {need_mb:.1f} MiB shared by the loader workers"
        + (f", {stored} read from {DECODED_NAME}" if stored else "")
    )
    return cache


def attach(cache: SharedImageCache | None, ds) -> None:
    """Give a dataset built later (the training images with the eval transform) the run's cache
    for the rows it has there (others stay in the dataset's own cache)."""
    if cache is not None and ds is not None and getattr(ds, "_cache", None) is not None:
        ds._cache = cache.view(ds.rows)
