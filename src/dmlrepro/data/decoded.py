"""Every image of a small prepared dataset, decoded once at preparation: ``decoded_images.npz``.

The file holds each image's uint8 RGB pixels as the data layer's decoder returns them ((3, H, W),
flattened, one after the other: ``pixels``) with its path and decoded height and width. Written
only when the decoded bytes fit ``MAX_MB`` (the embedded default's generated datasets; never a
benchmark). A run's shared image cache (``dmlrepro.train.imagecache``) starts filled from it
instead of decoding every image anew: the same bytes, so no result changes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

DECODED_NAME = "decoded_images.npz"
MAX_MB = 64.0


def write_decoded(folder: Path, paths: Sequence[str], sizes: Sequence[tuple[int, int]]) -> bool:
    """Decode the images ``paths`` of ``folder`` into its store when their recorded ``sizes`` say
    they fit ``MAX_MB``; False (nothing written) otherwise."""
    if 3 * sum(h * w for h, w in sizes) / 2**20 > MAX_MB:
        return False
    from .dataset import load_image  # deferred: torch, only to decode

    images = [load_image(folder / p) for p in paths]
    pixels = np.concatenate([img.reshape(-1).numpy() for img in images]) if images else np.zeros(0, np.uint8)
    np.savez(
        folder / DECODED_NAME,
        pixels=pixels,
        paths=np.asarray(list(paths), dtype=str),
        heights=np.asarray([img.shape[1] for img in images], dtype=np.int64),
        widths=np.asarray([img.shape[2] for img in images], dtype=np.int64),
    )
    return True


def read_decoded(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """path -> its decoded image (3, H, W) uint8 from the folder's store; empty without one (or for
    a store that does not add up)."""
    try:
        with np.load(Path(folder) / DECODED_NAME) as store:
            pixels, paths, heights, widths = (store[k] for k in ("pixels", "paths", "heights", "widths"))
    except (OSError, ValueError, KeyError):
        return {}
    ends = np.cumsum(3 * heights * widths)
    if pixels.dtype != np.uint8 or len(paths) != len(ends) or (len(ends) and ends[-1] != len(pixels)):
        return {}
    starts = ends - 3 * heights * widths
    return {
        str(p): pixels[s:e].reshape(3, int(h), int(w)) for p, s, e, h, w in zip(paths, starts, ends, heights, widths)
    }
