"""``synthetic``: a procedurally generated fine-grained retrieval dataset (no network needed).

Design (what a DML method must learn):

* Classes come in *families* of ``family_size`` (default 4). Each class has ``modes`` (default 2)
  visually distinct sub-modes: per mode a different shape (of 8 kinds), a hue spread round the
  colour circle (1/modes apart, +-0.1) and an optional inset of a second colour. The classes of
  one family share all of that; they differ only by small marker dots in the glyph's frame: class j of a family
  has ``1 + j // 2`` dots in a row, above the centre for even j and below it for odd j — a fine difference
  between classes next to a large intra-class one (two modes). The cue is symmetric under a horizontal flip,
  so the standard train augmentation (RandomResizedCrop + flip) does not turn one class into another.
* Nuisance per image: pose (rotation +-30 degrees, scale 0.7-1.0, translation +-15 %), colour
  (hue +-0.04, saturation, brightness), a random two-colour gradient background, 3-6 clutter
  shapes behind the glyph, one clutter line in front, pixel noise (sigma 6).
* Rendered at 2x with PIL and box-downsampled to ``size`` (default 32 px), saved as PNG with fixed
  settings (no metadata), so the same seed gives byte-identical files (same numpy/Pillow/zlib).
* Every image has its own generator ``np.random.default_rng([seed, class, index])``.
* Split as for the real benchmarks: first half of the classes ``train``, second half ``test``.
"""

from __future__ import annotations

import colorsys
import json
import os
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm.auto import tqdm

from .prepared import (
    INFO_NAME,
    dataset_dir,
    discard_staging,
    finalize,
    is_prepared,
    manifest_path,
    new_staging,
    unprepare,
)
from .splits import standard_split

NAME = "synthetic"
SHAPES = ("circle", "square", "triangle", "star", "cross", "hexagon", "diamond", "bar")
DEFAULTS = dict(num_classes=128, images_per_class=40, size=32, seed=0, modes=2, family_size=4)


def _unit_polygon(kind: str) -> np.ndarray:
    """Vertices (K, 2) of a shape of radius ~1 in its own frame (y up)."""
    if kind == "circle":
        t = np.linspace(0, 2 * np.pi, 32, endpoint=False)
        return np.stack([np.cos(t), np.sin(t)], 1)
    if kind in ("square", "triangle", "hexagon"):
        k = {"square": 4, "triangle": 3, "hexagon": 6}[kind]
        t = np.pi / 2 + np.linspace(0, 2 * np.pi, k, endpoint=False) + (np.pi / 4 if k == 4 else 0)
        return np.stack([np.cos(t), np.sin(t)], 1)
    if kind == "star":
        t = np.pi / 2 + np.linspace(0, 2 * np.pi, 10, endpoint=False)
        r = np.where(np.arange(10) % 2 == 0, 1.0, 0.45)
        return np.stack([r * np.cos(t), r * np.sin(t)], 1)
    if kind == "cross":
        a, b = 0.32, 1.0
        return np.array(
            [[-a, b], [a, b], [a, a], [b, a], [b, -a], [a, -a], [a, -b], [-a, -b], [-a, -a], [-b, -a], [-b, a], [-a, a]]
        )
    if kind == "diamond":
        return np.array([[0.0, 1.0], [0.6, 0.0], [0.0, -1.0], [-0.6, 0.0]])
    if kind == "bar":
        return np.array([[-1.0, 0.4], [1.0, 0.4], [1.0, -0.4], [-1.0, -0.4]])
    raise ValueError(kind)


_POLY = {k: _unit_polygon(k) for k in SHAPES}


def _hsv(h: float, s: float, v: float) -> tuple[int, int, int]:
    r, g, b = colorsys.hsv_to_rgb(h % 1.0, min(max(s, 0.0), 1.0), min(max(v, 0.0), 1.0))
    return int(r * 255), int(g * 255), int(b * 255)


def class_specs(num_classes: int, modes: int, family_size: int, seed: int) -> list[dict]:
    """Per class: its family's mode descriptions and its own marker (number of dots, above/below)."""
    n_fam = -(-num_classes // family_size)
    specs = []
    for f in range(n_fam):
        rng = np.random.default_rng([seed, 1_000_003, f])
        fam_modes = []
        # distinct sub-modes: different shapes (while 8 kinds last) and hues spread round the circle
        shapes = rng.permutation(len(SHAPES))
        h0 = rng.random()
        for k in range(modes):
            fam_modes.append(
                dict(
                    shape=SHAPES[shapes[k % len(SHAPES)]],
                    hue=float((h0 + k / modes + rng.uniform(-0.1, 0.1)) % 1.0),
                    inset=bool(rng.random() < 0.5),
                    inset_hue=float(rng.random()),
                    marker_dark=bool(rng.random() < 0.5),
                )
            )
        for j in range(family_size):
            if len(specs) < num_classes:
                specs.append(dict(family=f, modes=fam_modes, dots=1 + j // 2, dots_up=(j % 2 == 0)))
    return specs


def _place(poly: np.ndarray, cx: float, cy: float, r: float, rot: float) -> list[tuple[float, float]]:
    c, s = np.cos(rot), np.sin(rot)
    x = poly[:, 0] * c - poly[:, 1] * s
    y = poly[:, 0] * s + poly[:, 1] * c
    return list(zip((cx + r * x).tolist(), (cy - r * y).tolist()))


def render(spec: dict, size: int, rng: np.random.Generator) -> Image.Image:
    """One image of a class (see module doc for the nuisance model)."""
    S = 2 * size  # supersampled canvas
    # background: gradient between two desaturated colours in a random direction
    c0 = np.array(_hsv(rng.random(), rng.uniform(0.0, 0.5), rng.uniform(0.3, 0.9)), float)
    c1 = np.array(_hsv(rng.random(), rng.uniform(0.0, 0.5), rng.uniform(0.3, 0.9)), float)
    ang = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:S, 0:S] / (S - 1)
    t = np.clip(0.5 + (xx - 0.5) * np.cos(ang) + (yy - 0.5) * np.sin(ang), 0, 1)[..., None]
    img = Image.fromarray(((1 - t) * c0 + t * c1).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    # clutter behind the glyph
    for _ in range(int(rng.integers(3, 7))):
        kind = SHAPES[rng.integers(len(SHAPES))]
        col = _hsv(rng.random(), rng.uniform(0.2, 1.0), rng.uniform(0.3, 1.0))
        d.polygon(
            _place(
                _POLY[kind],
                rng.uniform(0, S),
                rng.uniform(0, S),
                rng.uniform(0.06, 0.18) * S,
                rng.uniform(0, 2 * np.pi),
            ),
            fill=col,
        )
    # the class glyph (one of the class's modes)
    mode = spec["modes"][rng.integers(len(spec["modes"]))]
    rot = np.deg2rad(rng.uniform(-30, 30))
    r = S * 0.36 * rng.uniform(0.7, 1.0)
    cx, cy = S / 2 + rng.uniform(-0.15, 0.15) * S, S / 2 + rng.uniform(-0.15, 0.15) * S
    hue = mode["hue"] + rng.uniform(-0.04, 0.04)
    d.polygon(
        _place(_POLY[mode["shape"]], cx, cy, r, rot), fill=_hsv(hue, rng.uniform(0.6, 1.0), rng.uniform(0.6, 1.0))
    )
    if mode["inset"]:
        d.polygon(
            _place(_POLY[mode["shape"]], cx, cy, 0.45 * r, rot),
            fill=_hsv(mode["inset_hue"] + rng.uniform(-0.04, 0.04), rng.uniform(0.6, 1.0), rng.uniform(0.6, 1.0)),
        )
    # the fine, class-specific cue: 1-3 dots in a row above or below the centre, glyph frame
    v = rng.uniform(0.0, 0.15) if mode["marker_dark"] else rng.uniform(0.9, 1.0)
    n, mr = spec["dots"], max(0.17 * r, 2.0)
    gy = 0.55 if spec["dots_up"] else -0.55
    c, s_ = np.cos(rot), np.sin(rot)
    for k in range(n):
        gx = (k - (n - 1) / 2) * 0.5
        mx, my = cx + r * (gx * c - gy * s_), cy - r * (gx * s_ + gy * c)
        d.ellipse([mx - mr, my - mr, mx + mr, my + mr], fill=_hsv(0, 0, v))
    # one occluding clutter line in front
    p = rng.uniform(0, S, size=4)
    d.line(p.tolist(), fill=_hsv(rng.random(), rng.uniform(0, 1), rng.uniform(0.2, 1)), width=int(rng.integers(1, 4)))
    small = np.asarray(img.reduce(2), dtype=np.float32)
    small += rng.normal(0.0, 6.0, size=small.shape[:2] + (1,)).astype(np.float32)
    return Image.fromarray(np.clip(np.rint(small), 0, 255).astype(np.uint8), "RGB")


def save_png(img: Image.Image, path: Path) -> None:
    # fixed settings, no metadata chunks: byte-identical output for identical pixels
    img.save(path, format="PNG", compress_level=6, optimize=False)


def generate(
    staging: Path,
    num_classes: int,
    images_per_class: int,
    size: int,
    seed: int,
    modes: int,
    family_size: int,
    progress: bool = True,
) -> tuple[list[str], list[int]]:
    if num_classes < 2 or images_per_class < 2 or size < 8 or modes < 1 or family_size < 1:
        raise ValueError(
            f"synthetic: invalid parameters num_classes={num_classes}, images_per_class={images_per_class}, "
            f"size={size}, modes={modes}, family_size={family_size}"
        )
    specs = class_specs(num_classes, modes, family_size, seed)
    paths, labels = [], []
    with tqdm(total=num_classes * images_per_class, desc="generate synthetic", unit="img", disable=not progress) as bar:
        for c, spec in enumerate(specs):
            folder = staging / "images" / f"c{c:04d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(images_per_class):
                img = render(spec, size, np.random.default_rng([seed, c, i]))
                rel = f"images/c{c:04d}/{i:04d}.png"
                save_png(img, staging / rel)
                paths.append(rel)
                labels.append(c)
                bar.update(1)
    return paths, labels


def _info_matches(ds_dir: Path, params: dict) -> bool:
    try:
        return json.loads((ds_dir / INFO_NAME).read_text()).get("params") == params
    except (OSError, ValueError):
        return False


def prepare_synthetic(
    root: str | os.PathLike, *, force: bool = False, progress: bool = True, name: str = NAME, **params
) -> Path:
    """Generate (or reuse, if prepared with the same parameters) ``<root>/synthetic``."""
    bad = set(params) - set(DEFAULTS)
    if bad:
        raise TypeError(f"synthetic: unknown parameter(s) {sorted(bad)}; expected {sorted(DEFAULTS)}")
    p = {**DEFAULTS, **{k: int(v) for k, v in params.items() if v is not None}}
    ds_dir = dataset_dir(root, name)
    if is_prepared(root, name) and not force and _info_matches(ds_dir, p):
        return manifest_path(root, name)
    unprepare(ds_dir)
    staging = new_staging(ds_dir)
    try:
        t0 = time.perf_counter()
        paths, labels = generate(staging, progress=progress, **p)
        seconds = time.perf_counter() - t0
    except BaseException:
        discard_staging(staging)
        raise
    return finalize(
        ds_dir,
        staging,
        paths,
        labels,
        standard_split(labels),
        info={"dataset": name, "params": p, "generation_seconds": round(seconds, 2)},
    )
