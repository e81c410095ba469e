"""``ManifestDataset``: a torch Dataset over (a subset of) a manifest.

``__getitem__(i)`` returns ``(image, label, i)``: the image as a uint8 tensor (3, H, W) passed
through ``transform``, the int label (optionally replaced from a noisy-label file), and ``i``, the
position in this dataset (what samplers and embedding writers index by). Decoding uses
``torchvision.io.decode_image`` and falls back to PIL for formats it cannot read. Only paths,
labels and the transform are stored, so the object pickles cheaply into DataLoader workers.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .label_noise import read_noisy_labels
from .manifest import Manifest, ManifestError, read_manifest

# torchvision 0.29 deprecates its image codecs in favour of torchcodec (not a dependency here);
# they still work, so only that message is silenced, around the call. PIL stays the fallback.
_TV_DEPRECATION = "The image decoding and encoding capabilities of TorchVision"


def load_image(path: str | os.PathLike) -> torch.Tensor:
    """Decode an image file to a uint8 RGB tensor (3, H, W)."""
    from torchvision.io import ImageReadMode, decode_image  # deferred: torchvision, at the first decoded image

    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:  # removed after `prepare`: name it and what brings it back
        raise FileNotFoundError(
            f"{path}: image missing (a row of the dataset's manifest.csv names it); expected "
            f"the file `dmlrepro prepare` wrote: prepare the dataset again with --force"
        ) from None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_TV_DEPRECATION, category=DeprecationWarning)
            return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError):
        from PIL import Image  # deferred: PIL, only for what torchvision cannot decode

        try:
            with Image.open(path) as im:
                a = np.asarray(im.convert("RGB"))
        except (OSError, ValueError) as e:
            raise OSError(f"{path}: cannot decode image ({e})") from None
        return torch.from_numpy(a.copy()).permute(2, 0, 1).contiguous()


class ManifestDataset(Dataset):
    """Images of a manifest, optionally restricted to a split name or to explicit row indices.

    Args:
        manifest: a ``Manifest``, a manifest CSV path or a dataset folder.
        split: a split name (``train``/``test``/``query``/``gallery``) or None for all rows.
        indices: explicit manifest row indices (e.g. from ``splits.split_indices``); overrides ``split``.
        transform: callable applied to the uint8 image tensor.
        label_override: path of a noisy-label file (``label_noise.write_noisy_labels``); rows
            listed there get their ``noisy_label``; the true labels stay in ``true_labels``.
        cache_images: keep each decoded image in memory after its first read (per process, so per
            DataLoader worker): for datasets small enough to hold, where reading and decoding every
            image every epoch costs more than the model (the embedded default's 32 px images). The
            transform gets a copy, so an in-place transform cannot alter the cache.
    """

    def __init__(
        self,
        manifest: Manifest | str | os.PathLike,
        split: str | None = None,
        indices: Sequence[int] | None = None,
        transform: Callable | None = None,
        label_override: str | os.PathLike | None = None,
        cache_images: bool = False,
    ):
        m = manifest if isinstance(manifest, Manifest) else read_manifest(manifest)
        if indices is not None:
            rows = np.asarray(indices, dtype=np.int64)
        elif split is not None:
            rows = m.indices(split)
            if not len(rows):
                # name what the manifest has: a typo'd or absent split is a config error, not a crash
                raise ManifestError(
                    f"{m.source}: no rows with split {split!r}; expected one of the "
                    f"manifest's splits {sorted(set(m.splits.tolist()))}"
                )
        else:
            rows = np.arange(len(m))
        self.root = str(m.root)
        self.rows = rows
        self.paths = [m.paths[i] for i in rows]
        self.true_labels = m.labels[rows].copy()
        self.labels = self.true_labels.copy()
        if label_override is not None:
            noisy = read_noisy_labels(label_override)
            for j, p in enumerate(self.paths):
                if p in noisy:
                    self.labels[j] = noisy[p]
        self.transform = transform
        self._cache: dict[int, torch.Tensor] | None = {} if cache_images else None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        img = self._image(i)
        if self._cache is not None:
            img = img.clone()
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.labels[i]), int(i)

    def with_transform(self, transform: Callable | None) -> ManifestDataset:
        """The same rows and labels under another transform, sharing this dataset's decoded images
        (its cache, when caching)."""
        other = copy.copy(self)
        other.transform = transform
        return other

    def _image(self, i: int) -> torch.Tensor:
        """The decoded image at position i (the cache's own tensor when caching)."""
        if self._cache is None:
            return load_image(os.path.join(self.root, self.paths[i]))
        if i not in self._cache:
            self._cache[i] = load_image(os.path.join(self.root, self.paths[i]))
        return self._cache[i]

    def seeded_batch(self, keys: Sequence[tuple[int, int | None]]) -> list | None:
        """``[self[i] for i, seed in keys]``, each transformed under its seed as
        ``SeededDataset`` seeds it, in one batched transform where the transform has one (a
        ``SquareFastPath``) and the images are cached at its side; None otherwise."""
        batched = getattr(self.transform, "transform_batch", None)
        if batched is None or self._cache is None:
            return None
        positions = [int(i) for i, _ in keys]
        images = [self._image(i) for i in positions]
        out = batched(images, [seed for _, seed in keys])
        if out is None:
            return None
        return [(out[k], int(self.labels[i]), i) for k, i in enumerate(positions)]
