"""Decode and augment a batch of JPEGs on the training device: nvJPEG on CUDA, the papers' crops there.

``DevicePipeline(train, size, ..., device)`` takes the batch's encoded JPEG files (1-D uint8 CPU
tensors) and per-image seeds and returns the normalised batch (B, 3, size, size) float32 on
``device``. It applies the transforms of ``transforms.build_transform`` — train: [Resize] →
RandomResizedCrop (or Resize → RandomCrop) → flip; eval: Resize → CenterCrop — with the crop and flip
parameters drawn exactly as the CPU path draws them: torch's CPU generator seeded with the image's
seed (``train.run_data.SeededDataset``), the same torchvision transforms' ``make_params`` in the
same order, the caller's generator state restored afterwards. Decoding is
``torchvision.io.decode_jpeg(list, device=device)`` (one batched nvJPEG call on CUDA); an image it
cannot decode there (CMYK, progressive corner cases, not a JPEG) is decoded by the data layer's
``load_image`` on the CPU and moved.

On ``device="cpu"`` the output equals the CPU path's bit for bit (tests/data/test_device_pipeline.py):
the same decoder, kernels and parameters. On CUDA the parameters are the same, the pixels may
differ slightly: nvJPEG's inverse DCT and chroma upsampling are not libjpeg-turbo's, and a uint8
image is resized in float32 and rounded on CUDA where the CPU has an integer kernel
(docs/data.md#device-side-decoding: measured differences, and why it is a run-config choice).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal

import torch

from .dataset import _TV_DEPRECATION
from .transforms import BNINCEPTION_MEAN_BGR, IMAGENET_MEAN, IMAGENET_STD, Normalization, default_resize


class DevicePipeline:
    def __init__(
        self,
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
        device: str | torch.device = "cuda",
    ):
        from torchvision.transforms import v2  # deferred: torchvision, only where a pipeline is built

        self.device = usable_device(device)
        if resize_mode not in ("short", "square"):
            raise ValueError(f"resize_mode {resize_mode!r}, expected 'short' or 'square'")
        if train_crop not in ("rrc", "random"):
            raise ValueError(f"train_crop {train_crop!r}, expected 'rrc' or 'random'")
        self.train, self.size, self.resize_mode, self.hflip = train, size, resize_mode, hflip if train else 0.0
        self.resized_crop = train and train_crop == "rrc"
        if train and train_crop == "random":
            self.first_resize = train_resize or (default_resize(size) if resize is None else resize)
            self.crop = v2.RandomCrop(size)
        elif train:
            self.first_resize = train_resize
            self.crop = v2.RandomResizedCrop(size, scale=tuple(scale), ratio=tuple(ratio), antialias=True)
        else:
            self.first_resize, self.crop = default_resize(size) if resize is None else resize, None
        self.normalize = BatchNormalize(normalization, self.device)

    def __call__(self, encoded: Sequence[torch.Tensor], seeds: Sequence[int | None]) -> torch.Tensor:
        """(B, 3, size, size) float32 on the device from B encoded JPEGs and their seeds (None: eval only)."""
        if self.train and any(seed is None for seed in seeds):
            raise ValueError("DevicePipeline: a training batch needs a seed per image (the crop's draws)")
        images = decode_batch(encoded, self.device)
        return self.normalize(torch.stack([self._augment(img, seed) for img, seed in zip(images, seeds)]))

    def _augment(self, img: torch.Tensor, seed: int | None) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F  # deferred: torchvision

        if self.first_resize is not None:
            img = F.resize(img, self._resize_arg(self.first_resize), antialias=True)
        if self.crop is None:
            return F.center_crop(img, [self.size, self.size])
        top, left, height, width, flip = self.draw(img.shape[-2], img.shape[-1], seed)
        if self.resized_crop:
            img = F.resized_crop(img, top, left, height, width, [self.size, self.size], antialias=True)
        else:
            img = F.crop(img, top, left, height, width)
        return img.flip(-1) if flip else img

    def _resize_arg(self, side: int) -> list[int]:
        return [side] if self.resize_mode == "short" else [side, side]

    def draw(self, height: int, width: int, seed: int) -> tuple[int, int, int, int, bool]:
        """(top, left, height, width, flip) of an image of height × width (after the first resize), drawn
        from torch's CPU generator seeded with `seed`, as the CPU path's transforms draw them."""
        gen = torch.default_generator
        saved = gen.get_state()
        gen.manual_seed(int(seed))
        try:
            shape_only = torch.empty(1, dtype=torch.uint8).expand(3, height, width)  # make_params reads the size
            params = self.crop.make_params([shape_only])
            flip = self.hflip > 0 and not bool(torch.rand(1) >= self.hflip)  # v2's random-apply draw
        finally:
            gen.set_state(saved)
        return params["top"], params["left"], params["height"], params["width"], flip


class BatchNormalize:
    """`transforms.normalize_transform`'s operations on a (B, 3, H, W) uint8 batch on the device, with the
    same arithmetic (ToDtype(scale=True) then Normalize: sub(mean).div(std); BN-Inception: BGR minus mean)."""

    def __init__(self, normalization: Normalization, device: torch.device):
        if normalization not in ("imagenet", "bninception", "none"):
            raise ValueError(f"normalization {normalization!r}, expected 'imagenet', 'bninception' or 'none'")
        self.normalization = normalization
        mean = BNINCEPTION_MEAN_BGR if normalization == "bninception" else IMAGENET_MEAN
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD, dtype=torch.float32, device=device).view(3, 1, 1)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F  # deferred: torchvision

        if self.normalization == "bninception":
            return batch.to(torch.float32).flip(-3) - self.mean
        x = F.to_dtype_image(batch, torch.float32, scale=True)
        return x.sub_(self.mean).div_(self.std) if self.normalization == "imagenet" else x


def usable_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device; one clear line where it is CUDA and torch sees no GPU."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device-side decoding on {device} was requested but torch sees no CUDA GPU; "
            "decode on the CPU (the data layer's transforms) instead"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device-side decoding runs on 'cpu' or 'cuda', got {str(device)!r}")
    return device


def decode_batch(encoded: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """uint8 RGB images (3, H, W) on `device`: one batched `decode_jpeg`; images it rejects are decoded
    one by one the data layer's way (torchvision's CPU decoder, else PIL) and moved."""
    from torchvision.io import ImageReadMode, decode_jpeg  # deferred: torchvision

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TV_DEPRECATION, category=DeprecationWarning)
        try:
            return list(decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            return [decode_one(data, device) for data in encoded]


def decode_one(data: torch.Tensor, device: torch.device) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg  # deferred: torchvision

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_TV_DEPRECATION, category=DeprecationWarning)
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return decode_on_cpu(data).to(device)


def decode_on_cpu(data: torch.Tensor) -> torch.Tensor:
    """One encoded image decoded as the data layer decodes a file (`dataset.load_image`): torchvision's
    CPU decoder, else PIL."""
    import io

    import numpy as np
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_image  # deferred: torchvision

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_TV_DEPRECATION, category=DeprecationWarning)
            return decode_image(data, mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError):
        try:
            with Image.open(io.BytesIO(data.numpy().tobytes())) as im:
                pixels = np.asarray(im.convert("RGB"))
        except (OSError, ValueError) as e:
            raise OSError(f"cannot decode image ({e})") from None
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()
