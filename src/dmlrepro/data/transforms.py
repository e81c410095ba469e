"""Image transforms: train RandomResizedCrop + flip, eval resize + center crop, normalisations.

* ResNet / timm backbones: ImageNet mean/std on [0, 1] RGB (docs/readings/protocols.md#proto-r7).
* BN-Inception (Caffe weights): RGB -> BGR, 0-255 scale, mean [104, 117, 128] (BGR order), std 1
  (Proxy-Anchor ``dataset/utils.py``; docs/readings/protocols.md#proto-r7).
* MLRC / ASAP: train ``Resize(256) -> RandomResizedCrop(227, scale=(0.16, 1))``, eval
  ``Resize(256) -> CenterCrop(227)`` (ASAP App. A.2, docs/readings/asap.md#asap-r18): ``build_transform(..., size=227,
  train_resize=256, scale=(0.16, 1.0))``.
* RSW / PFML / Proxy-Anchor: train ``RandomResizedCrop(224)`` on the original image + flip, eval
  ``Resize(256) -> CenterCrop(224)``; ``resize_mode="square"`` gives the paper's "scaled to
  256x256" reading (docs/readings/rsw.md#rsw-r5).

Inputs are uint8 image tensors (C, H, W) as returned by ``ManifestDataset`` (PIL images work
too); outputs are float32 tensors (3, size, size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BNINCEPTION_MEAN_BGR = (104.0, 117.0, 128.0)

Normalization = Literal["imagenet", "bninception", "none"]


class BNInceptionNormalize(torch.nn.Module):
    """uint8/float RGB in 0-255 -> float32 BGR minus [104, 117, 128] (std 1)."""

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = img.to(torch.float32) if img.dtype == torch.uint8 else img.to(torch.float32)
        x = x.flip(-3)  # RGB -> BGR
        mean = torch.tensor(BNINCEPTION_MEAN_BGR, dtype=torch.float32).view(3, 1, 1)
        return x - mean


def normalize_transform(normalization: Normalization = "imagenet") -> Callable:
    """uint8 image tensor -> normalised float32 tensor."""
    if normalization == "imagenet":
        return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    if normalization == "bninception":
        return BNInceptionNormalize()
    if normalization == "none":
        return v2.ToDtype(torch.float32, scale=True)
    raise ValueError(f"normalization {normalization!r}, expected 'imagenet', 'bninception' or 'none'")


def default_resize(size: int) -> int:
    """256 for the usual 224/227 crops, else the same 256/224 ratio (e.g. 32 -> 37)."""
    return 256 if 224 <= size <= 256 else int(round(size * 256 / 224))


def build_transform(
    train: bool,
    size: int = 224,
    *,
    resize: int | None = None,
    resize_mode: Literal["short", "square"] = "short",
    normalization: Normalization = "imagenet",
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    train_resize: int | None = None,
    train_crop: Literal["rrc", "random"] = "rrc",
    hflip: float = 0.5,
    corruption: Callable | None = None,
) -> Callable:
    """Train: [Resize(train_resize)] -> RandomResizedCrop(size, scale, ratio) -> flip; with
    ``train_crop="random"`` (RSW paper's reading): Resize(train_resize or the eval resize) ->
    RandomCrop(size) -> flip.
    Eval: Resize(resize; shorter side, or square) -> CenterCrop(size) -> [corruption].
    Both end with the chosen normalisation.
    """
    if resize_mode not in ("short", "square"):
        raise ValueError(f"resize_mode {resize_mode!r}, expected 'short' or 'square'")
    if train_crop not in ("rrc", "random"):
        raise ValueError(f"train_crop {train_crop!r}, expected 'rrc' or 'random'")

    def _resize(r: int):
        return v2.Resize(r if resize_mode == "short" else (r, r), antialias=True)

    ops: list = [v2.ToImage()]  # PIL -> tensor; tensors pass through
    if train:
        if train_crop == "random":
            ops += [_resize(train_resize or (default_resize(size) if resize is None else resize)), v2.RandomCrop(size)]
        else:
            if train_resize is not None:
                ops.append(_resize(train_resize))
            ops.append(v2.RandomResizedCrop(size, scale=tuple(scale), ratio=tuple(ratio), antialias=True))
        if hflip > 0:
            ops.append(v2.RandomHorizontalFlip(hflip))
    else:
        ops += [_resize(default_resize(size) if resize is None else resize), v2.CenterCrop(size)]
    if corruption is not None:
        ops.append(corruption)
    normalize = normalize_transform(normalization)
    pipeline = v2.Compose(ops + [normalize])
    identity_size = _identity_size(train, size, resize, train_resize, train_crop)
    if identity_size is None:
        return pipeline
    return SquareFastPath(pipeline, identity_size, hflip if train else 0.0, _DirectNormalize(normalization), corruption)


class _DirectNormalize:
    """normalize_transform's operations without v2's dispatch (~150 us per call): the same as
    v2.ToDtype(scale=True) (``to(float32).mul_(1 / 255)``) and v2.Normalize (``sub(mean).div_(std)``).
    A class, not a closure: DataLoader workers pickle the transform."""

    def __init__(self, normalization: Normalization) -> None:
        if normalization not in ("imagenet", "bninception", "none"):
            raise ValueError(f"normalization {normalization!r}, expected 'imagenet', 'bninception' or 'none'")
        self.normalization = normalization
        self.bninception = BNInceptionNormalize()
        self.mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        if self.normalization == "bninception":
            return self.bninception(img)
        x = F.to_dtype_image(img, torch.float32, scale=True)
        return x.sub_(self.mean).div_(self.std) if self.normalization == "imagenet" else x


def _identity_size(train, size, resize, train_resize, train_crop) -> int | None:
    """The square side at which the pipeline's resize and crop are identities, or None (rrc); either
    resize mode leaves a square image of that side as it is."""
    if train and train_crop == "rrc":
        return None
    side = (train_resize if train else None) or (default_resize(size) if resize is None else resize)
    return size if side == size else None


class SquareFastPath:
    """``pipeline`` for a uint8 tensor of ``side`` x ``side``, where its resize and crop do nothing:
    the same flip draw (``torch.rand(1) >= p`` keeps, as v2's random transforms), the same
    corruption (RSW Table IV) and the same kernels, without v2's per-call dispatch (its cost per small
    image: docs/benchmarks.md#the-train-and-eval-transform-at-the-output-size-cpu; bit-identical,
    tests/data/test_transforms.py). Any other input goes
    through ``pipeline``."""

    def __init__(
        self, pipeline: v2.Compose, side: int, hflip: float, normalize: Callable, corruption: Callable | None = None
    ) -> None:
        self.pipeline, self.side, self.hflip, self.normalize = pipeline, side, hflip, normalize
        self.corruption = corruption

    def _fits(self, img) -> bool:
        """A uint8 (C, side, side) tensor: the input the fast path takes."""
        return (
            isinstance(img, torch.Tensor)
            and img.dtype == torch.uint8
            and img.ndim == 3
            and img.shape[-2:] == (self.side, self.side)
        )

    def __call__(self, img):
        if not self._fits(img):
            return self.pipeline(img)
        img = img.as_subclass(torch.Tensor)
        if self.hflip > 0 and not bool(torch.rand(1) >= self.hflip):
            img = img.flip(-1)
        if self.corruption is not None:
            img = self.corruption(img)
        return self.normalize(img)

    def transform_batch(self, images: Sequence[torch.Tensor], seeds: Sequence[int | None]) -> torch.Tensor | None:
        """``torch.stack([self(img) for img in images])`` with torch's generator seeded by
        ``seeds[k]`` for image k (as ``SeededDataset`` does; a None seed: no draw may happen, so
        only without flips), in one batch; None where an image is not a uint8 square of ``side``."""
        if not all(self._fits(img) for img in images):
            return None
        if self.hflip > 0 and any(seed is None for seed in seeds):
            return None
        batch = torch.stack([img.as_subclass(torch.Tensor) for img in images])
        if self.hflip > 0:
            gen = torch.Generator()
            keep = torch.tensor(
                [bool(torch.rand(1, generator=gen.manual_seed(int(seed))) >= self.hflip) for seed in seeds]
            )
            batch[~keep] = batch[~keep].flip(-1)
        if self.corruption is not None:  # image by image: each draws from its own bytes' RNG
            batch = torch.stack([self.corruption(img) for img in batch])
        return self.normalize(batch)

    def __repr__(self) -> str:
        return f"SquareFastPath(side={self.side}, {self.pipeline!r})"
