"""RSW Table IV image corruptions as eval-time transforms (docs/readings/rsw.md#rsw-r17).

The paper used imgaug 0.4.0 "with default settings for most corruptions"; imgaug is not a
dependency here, so each augmenter is re-implemented in numpy/torch after imgaug's definition:

=================  ===============================  ============================================
name               imgaug augmenter                 ``severity=None`` (imgaug 0.4.0 default)
=================  ===============================  ============================================
gaussian           AdditiveGaussianNoise            sigma ~ U(0, 15), same noise on all channels
uniform            AddElementwise                   integer add ~ U{-20..20} per pixel
salt_and_pepper    SaltAndPepper                    p ~ U(0, 0.03); pixel -> 0 or 255
dropout            Dropout                          p ~ U(0, 0.05); pixel -> 0
cutout             Cutout                           1 square, side 0.2 of the image, fill 128
shear              ShearX                           shear ~ U(-30, 30) degrees, fill 0
jigsaw             Jigsaw                           rows, cols ~ U{3..10}, max_steps 1
hue_saturation     AddToHueAndSaturation            hue, sat adds ~ U{-50..50} each (imgaug doc
                                                    example; hue 255 = 360 degrees)
defocus_blur       imgcorruptlike.DefocusBlur       severity ~ U{1..5} (imagecorruptions disks)
=================  ===============================  ============================================

``severity`` 1-5 fixes the strength instead (table ``LEVELS``; level 3 is the top of imgaug's
default range, 4-5 are stronger, as the paper's large drops suggest). Every parameter can also be
set by keyword. The random draw of each image is seeded by ``seed`` and a CRC of the image's
bytes, so a given image is corrupted identically for every method, epoch and worker.

Input/output: uint8 tensor (C, H, W) (or a PIL image -> PIL image); the shape is preserved.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

LEVELS: dict[str, tuple] = {
    "gaussian": (4.0, 8.0, 15.0, 25.0, 40.0),  # sigma (0-255 scale)
    "uniform": (7, 13, 20, 30, 45),  # max |add|
    "salt_and_pepper": (0.01, 0.02, 0.03, 0.06, 0.10),  # p
    "dropout": (0.02, 0.035, 0.05, 0.10, 0.20),  # p
    "cutout": (0.1, 0.15, 0.2, 0.3, 0.4),  # side / image side
    "shear": (10.0, 20.0, 30.0, 40.0, 45.0),  # |degrees|, random sign
    "jigsaw": (3, 4, 6, 8, 10),  # rows = cols
    "hue_saturation": (10, 25, 50, 75, 100),  # max |add| (imgaug units)
    "defocus_blur": (1, 2, 3, 4, 5),  # imagecorruptions severity
}
# imagecorruptions defocus_blur: (disk radius, alias blur sigma) per severity
_DEFOCUS = ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))


def _to_hwc(img) -> tuple[np.ndarray, Callable]:
    if isinstance(img, torch.Tensor):
        t = img.as_subclass(torch.Tensor)
        if t.dtype != torch.uint8 or t.ndim != 3:
            raise TypeError(f"corruptions expect a uint8 (C, H, W) tensor, got {t.dtype} {tuple(t.shape)}")
        return t.permute(
            1, 2, 0
        ).numpy().copy(), lambda a: torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).contiguous()
    from PIL import Image  # deferred: PIL, only the imgaug-style corruptions need it

    if isinstance(img, Image.Image):
        mode = img.mode
        return np.asarray(img.convert("RGB")).copy(), lambda a: Image.fromarray(a).convert(mode)
    raise TypeError(f"corruptions expect a uint8 tensor or a PIL image, got {type(img).__name__}")


class Corruption:
    """Base: ``__call__`` draws this image's parameters from its own RNG and applies ``apply``."""

    name = ""

    def __init__(self, severity: int | None = None, seed: int = 0):
        if severity is not None and severity not in (1, 2, 3, 4, 5):
            raise ValueError(f"{self.name}: severity {severity}, expected None or 1..5")
        self.severity, self.seed = severity, int(seed)

    def level(self):
        return LEVELS[self.name][self.severity - 1]

    def __call__(self, img):
        a, back = _to_hwc(img)
        rng = np.random.default_rng([self.seed, zlib.crc32(a.tobytes()), a.shape[0], a.shape[1]])
        out = self.apply(a, rng)
        return back(np.clip(out, 0, 255).astype(np.uint8))

    def apply(self, a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(severity={self.severity}, seed={self.seed})"


class GaussianNoise(Corruption):
    name = "gaussian"

    def __init__(self, severity=None, seed=0, scale=(0.0, 15.0)):
        super().__init__(severity, seed)
        self.scale = scale

    def apply(self, a, rng):
        sigma = self.level() if self.severity else rng.uniform(*self.scale)
        noise = rng.normal(0.0, sigma, size=a.shape[:2] + (1,))
        return np.rint(a + noise)


class UniformNoise(Corruption):
    name = "uniform"

    def __init__(self, severity=None, seed=0, value=(-20, 20)):
        super().__init__(severity, seed)
        self.value = value

    def apply(self, a, rng):
        lo, hi = (-self.level(), self.level()) if self.severity else self.value
        return a.astype(np.int32) + rng.integers(lo, hi + 1, size=a.shape[:2] + (1,))


class SaltAndPepper(Corruption):
    name = "salt_and_pepper"

    def __init__(self, severity=None, seed=0, p=(0.0, 0.03)):
        super().__init__(severity, seed)
        self.p = p

    def apply(self, a, rng):
        p = self.level() if self.severity else rng.uniform(*self.p)
        hit = rng.random(a.shape[:2]) < p
        salt = rng.random(a.shape[:2]) < 0.5
        out = a.copy()
        out[hit & salt] = 255
        out[hit & ~salt] = 0
        return out


class Dropout(Corruption):
    name = "dropout"

    def __init__(self, severity=None, seed=0, p=(0.0, 0.05)):
        super().__init__(severity, seed)
        self.p = p

    def apply(self, a, rng):
        p = self.level() if self.severity else rng.uniform(*self.p)
        out = a.copy()
        out[rng.random(a.shape[:2]) < p] = 0
        return out


class Cutout(Corruption):
    name = "cutout"

    def __init__(self, severity=None, seed=0, size=0.2, cval=128):
        super().__init__(severity, seed)
        self.size, self.cval = size, cval

    def apply(self, a, rng):
        h, w = a.shape[:2]
        side = max(1, int(round((self.level() if self.severity else self.size) * h)))
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)  # centre anywhere in the image (imgaug: uniform)
        y0, x0 = int(round(cy - side / 2)), int(round(cx - side / 2))
        out = a.copy()
        out[max(0, y0) : max(0, y0 + side), max(0, x0) : max(0, x0 + side)] = self.cval
        return out


class Shear(Corruption):
    name = "shear"

    def __init__(self, severity=None, seed=0, shear=(-30.0, 30.0), fill=0):
        super().__init__(severity, seed)
        self.shear, self.fill = shear, fill

    def apply(self, a, rng):
        deg = self.level() * rng.choice([-1.0, 1.0]) if self.severity else rng.uniform(*self.shear)
        source = _shear_source(a.shape[0], a.shape[1], float(deg))
        out = a.reshape(-1, a.shape[2])[np.maximum(source, 0)]
        out[source < 0] = self.fill
        return out.reshape(a.shape)


@functools.lru_cache(maxsize=64)
def _shear_source(h: int, w: int, deg: float) -> np.ndarray:
    """Which input pixel (row-major index; -1: the fill) each output pixel of torchvision's
    ``affine(shear=[deg, 0])`` copies. With nearest interpolation the shear is a gather, the same for
    every image of one size and angle: found once by shearing a float32 image of pixel indices (the
    dtype affine samples a uint8 image in, so the same grid; exact below 2**24 pixels)."""
    from torchvision.transforms.v2 import functional as TF  # deferred: torchvision, only this corruption needs it

    if h * w >= 2**24:
        raise ValueError(f"shear: {h}×{w} pixels cannot be indexed exactly in float32")
    index = torch.arange(h * w, dtype=torch.float32).reshape(1, h, w)
    moved = TF.affine(index, angle=0.0, translate=[0, 0], scale=1.0, shear=[deg, 0.0], fill=-1.0)
    return moved.reshape(-1).numpy().astype(np.int64)


class Jigsaw(Corruption):
    name = "jigsaw"

    def __init__(self, severity=None, seed=0, nb_rows=(3, 10), nb_cols=(3, 10), max_steps=1):
        super().__init__(severity, seed)
        self.nb_rows, self.nb_cols, self.max_steps = nb_rows, nb_cols, max_steps

    def apply(self, a, rng):
        if self.severity:
            rows = cols = self.level()
        else:
            rows, cols = (
                rng.integers(self.nb_rows[0], self.nb_rows[1] + 1),
                rng.integers(self.nb_cols[0], self.nb_cols[1] + 1),
            )
        h, w = a.shape[:2]
        ch, cw = h // rows, w // cols
        if ch == 0 or cw == 0:
            return a
        # imgaug generate_jigsaw_destinations: each step visits cells in random order and swaps
        # each with a random 4-neighbour inside the grid.
        dest = np.arange(rows * cols)
        for _ in range(self.max_steps):
            for cell in rng.permutation(rows * cols):
                r, c = divmod(int(cell), cols)
                dr, dc = ((-1, 0), (1, 0), (0, -1), (0, 1))[rng.integers(4)]
                r2, c2 = r + dr, c + dc
                if 0 <= r2 < rows and 0 <= c2 < cols:
                    j = r2 * cols + c2
                    dest[cell], dest[j] = dest[j], dest[cell]
        out = a.copy()
        for src in range(rows * cols):
            (r, c), (r2, c2) = divmod(src, cols), divmod(int(dest[src]), cols)
            out[r2 * ch : (r2 + 1) * ch, c2 * cw : (c2 + 1) * cw] = a[r * ch : (r + 1) * ch, c * cw : (c + 1) * cw]
        return out


def _rgb_to_hsv(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) / 255.0
    mx, mn = x.max(-1), x.min(-1)
    d = mx - mn
    s = np.where(mx > 0, d / np.where(mx > 0, mx, 1), 0.0)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    dd = np.where(d > 0, d, 1)
    h = np.where(mx == r, ((g - b) / dd) % 6, np.where(mx == g, (b - r) / dd + 2, (r - g) / dd + 4))
    h = np.where(d > 0, h / 6.0, 0.0)
    return np.stack([h, s, mx], -1)


def _hsv_to_rgb(x: np.ndarray) -> np.ndarray:
    h, s, v = x[..., 0], x[..., 1], x[..., 2]
    i = np.floor(h * 6.0) % 6
    f = h * 6.0 - np.floor(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = np.zeros(x.shape)
    for k, (r, g, b) in enumerate(choices):
        m = i == k
        out[m] = np.stack([r[m], g[m], b[m]], -1)
    return np.rint(out * 255.0)


class HueSaturation(Corruption):
    name = "hue_saturation"

    def __init__(self, severity=None, seed=0, value=(-50, 50)):
        super().__init__(severity, seed)
        self.value = value

    def apply(self, a, rng):
        if self.severity:
            dh, ds = self.level() * rng.choice([-1, 1]), self.level() * rng.choice([-1, 1])
        else:
            dh, ds = rng.integers(self.value[0], self.value[1] + 1, size=2)
        hsv = _rgb_to_hsv(a)
        hsv[..., 0] = (hsv[..., 0] + dh / 255.0) % 1.0  # imgaug: hue +-255 <-> +-360 degrees
        hsv[..., 1] = np.clip(hsv[..., 1] + ds / 255.0, 0.0, 1.0)
        return _hsv_to_rgb(hsv)


@functools.lru_cache(maxsize=8)
def _disk(radius: float, alias_blur: float) -> torch.Tensor:
    # imagecorruptions.corruptions.disk: aliased disk, normalised, then Gaussian-blurred
    L = np.arange(-max(8, radius), max(8, radius) + 1)
    X, Y = np.meshgrid(L, L)
    k = (X**2 + Y**2 <= radius**2).astype(np.float64)
    k /= k.sum()
    ks = 3 if radius <= 8 else 5
    g = np.exp(-0.5 * (np.arange(ks) - ks // 2) ** 2 / alias_blur**2)
    g /= g.sum()
    kt = torch.from_numpy(k)[None, None]
    gt = torch.from_numpy(np.outer(g, g))[None, None]
    return F.conv2d(F.pad(kt, (ks // 2,) * 4, mode="reflect"), gt)[0, 0]


class DefocusBlur(Corruption):
    name = "defocus_blur"

    def __init__(self, severity=None, seed=0, severity_range=(1, 5)):
        super().__init__(severity, seed)
        self.severity_range = severity_range

    def apply(self, a, rng):
        sev = self.level() if self.severity else int(rng.integers(self.severity_range[0], self.severity_range[1] + 1))
        k = _disk(*_DEFOCUS[sev - 1])
        pad = k.shape[-1] // 2
        x = torch.from_numpy(a.astype(np.float64)).permute(2, 0, 1)[:, None]  # (C, 1, H, W)
        mode = "reflect" if min(a.shape[:2]) > pad else "replicate"
        y = F.conv2d(F.pad(x, (pad,) * 4, mode=mode), k[None, None])
        return np.rint(y[:, 0].permute(1, 2, 0).numpy())


CORRUPTIONS: dict[str, type[Corruption]] = {
    c.name: c
    for c in (GaussianNoise, UniformNoise, SaltAndPepper, Dropout, Cutout, Shear, Jigsaw, HueSaturation, DefocusBlur)
}
# Table IV row labels -> names
TABLE_IV = {
    "Gaussian": "gaussian",
    "Uniform": "uniform",
    "Salt and Pepper": "salt_and_pepper",
    "Dropout": "dropout",
    "Cutout": "cutout",
    "Affine Shear": "shear",
    "Jigsaw": "jigsaw",
    "Add Hue and Saturation": "hue_saturation",
    "Defocus Blur": "defocus_blur",
}


def build_corruption(name: str, severity: int | None = None, seed: int = 0, **params) -> Corruption:
    """A corruption by name (see ``CORRUPTIONS``; Table IV labels also accepted)."""
    key = TABLE_IV.get(name, name)
    if key not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; expected one of {sorted(CORRUPTIONS)}")
    return CORRUPTIONS[key](severity=severity, seed=seed, **params)
