"""``digits``: scikit-learn's real handwritten digits (``sklearn.datasets.load_digits``: 1,797
8x8 grey images, values 0-16, 10 classes), upsampled (bilinear) to ``size`` px RGB PNGs.

Class-disjoint split like the benchmarks: digits 0-4 ``train``, 5-9 ``test``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from .prepared import dataset_dir, discard_staging, finalize, is_prepared, manifest_path, new_staging, unprepare
from .splits import standard_split
from .synthetic import _info_matches, save_png

NAME = "digits"
EXPECTED = {"images": 1797, "classes": 10, "train_images": 901}  # digits 0-4: 178 + 182 + 177 + 183 + 181


def prepare_digits(
    root: str | os.PathLike, *, size: int = 32, force: bool = False, progress: bool = True, strict_counts: bool = True
) -> Path:
    from sklearn.datasets import load_digits  # deferred: scikit-learn, only preparing digits needs it

    params = {"size": int(size)}
    ds_dir = dataset_dir(root, NAME)
    if is_prepared(root, NAME) and not force and _info_matches(ds_dir, params):
        return manifest_path(root, NAME)
    unprepare(ds_dir)
    data = load_digits()
    staging = new_staging(ds_dir)
    paths, labels = [], []
    try:
        for i in tqdm(range(len(data.target)), desc="write digits", unit="img", disable=not progress):
            g = np.rint(data.images[i] * (255.0 / 16.0)).astype(np.uint8)
            img = Image.fromarray(g, "L").resize((size, size), Image.BILINEAR).convert("RGB")
            lab = int(data.target[i])
            rel = f"images/{lab}/{i:04d}.png"
            (staging / "images" / str(lab)).mkdir(parents=True, exist_ok=True)
            save_png(img, staging / rel)
            paths.append(rel)
            labels.append(lab)
    except BaseException:
        discard_staging(staging)
        raise
    return finalize(
        ds_dir,
        staging,
        paths,
        labels,
        standard_split(labels),
        expected_counts=EXPECTED,
        strict_counts=strict_counts,
        info={"dataset": NAME, "params": params},
    )
