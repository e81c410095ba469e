"""The IDX format of MNIST and Fashion-MNIST, and their layout reader for the benchmark registry.

IDX (yann.lecun.com/exdb/mnist): a big-endian uint32 magic number, one big-endian uint32 per
dimension, then the data as uint8 in C order. Images: magic 2051, dims (n, 28, 28); labels: magic
2049, dims (n,). The releases gzip each file (``*-idx3-ubyte.gz``, ``*-idx1-ubyte.gz``).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from .layout import LayoutError, Rows
from .synthetic import save_png

IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
SIDE = 28  # image height and width of both releases
NUM_CLASSES = 10
RAW_DIR = "raw"  # where prepare places the four .gz files in the dataset folder
FILES = {  # split -> (images file, labels file), the release's names
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def idx_format(filename: str) -> tuple[int, int]:
    """(magic number, number of dims) of a release file by its name (``*-idx3-ubyte``: images)."""
    return (IMAGES_MAGIC, 3) if "-idx3-" in filename else (LABELS_MAGIC, 1)


class IdxError(LayoutError):
    """An IDX file is damaged or is not the file its name says."""


def read_idx(path: str | Path, magic: int, ndim: int) -> np.ndarray:
    """The uint8 array of a gzip-compressed IDX file with this magic number and number of dims."""
    path = Path(path)
    content = "images" if magic == IMAGES_MAGIC else "labels"
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read()
    except EOFError as e:
        raise IdxError(
            f"{path.name}: truncated gzip stream ({e}); expected the complete gzip-compressed IDX "
            f"{content} file of the official release"
        ) from None
    except (OSError, zlib.error) as e:
        raise IdxError(
            f"{path.name}: not a readable gzip file ({e}); expected the gzip-compressed IDX {content} "
            "file of the official release"
        ) from None
    return parse_idx(data, path.name, magic, ndim)


def parse_idx(data: bytes, name: str, magic: int, ndim: int) -> np.ndarray:
    """The uint8 array of the uncompressed IDX bytes ``data`` of the file ``name`` (for messages),
    checked: this magic number, ``ndim`` dims, exactly the declared number of bytes."""
    content = "images" if magic == IMAGES_MAGIC else "labels"
    header = 4 * (1 + ndim)
    if len(data) < header:
        raise IdxError(
            f"{name}: truncated header: {len(data)} bytes, expected at least {header} (magic and {ndim} dimension(s))"
        )
    got = int.from_bytes(data[:4], "big")
    if got != magic:
        raise IdxError(
            f"{name}: bad magic number {got}, expected {magic} (IDX {content}, uint8, {ndim}-d); "
            "the file is not the official release, or images and labels are swapped"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
    size = int(np.prod(dims, dtype=np.int64))
    if len(data) - header != size:
        state = "truncated data" if len(data) - header < size else "trailing bytes"
        raise IdxError(
            f"{name}: {state}: the header declares {content} of shape {dims} = {size} bytes, "
            f"the file holds {len(data) - header}"
        )
    return np.frombuffer(data, np.uint8, size, header).reshape(dims)


def read_split(images_path: str | Path, labels_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (n, 28, 28), labels (n,)) of one split, checked against each other."""
    images = read_idx(images_path, IMAGES_MAGIC, 3)
    labels = read_idx(labels_path, LABELS_MAGIC, 1)
    iname, lname = Path(images_path).name, Path(labels_path).name
    if images.shape[1:] != (SIDE, SIDE):
        raise IdxError(f"{iname}: images of {images.shape[1]}x{images.shape[2]} px, expected {SIDE}x{SIDE}")
    if len(images) != len(labels):
        raise IdxError(
            f"{iname} holds {len(images)} images but {lname} holds {len(labels)} labels; "
            "expected one label per image (files of different releases?)"
        )
    bad = np.flatnonzero(labels >= NUM_CLASSES)
    if len(bad):
        raise IdxError(
            f"{lname}: label {int(labels[bad[0]])} at index {int(bad[0])} ({len(bad)} such); "
            f"expected 0-{NUM_CLASSES - 1}"
        )
    return images, labels


def read_idx_layout(staging: Path, *, progress: bool = True) -> Rows:
    """``raw/`` (the four .gz files) -> ``images/<split>/<label>/<index:05d>.png`` (grey PNG) and
    the rows: split ``train`` (the 60,000 training images) and ``test`` (the 10,000 test images),
    label = the class 0-9, the same classes in both splits. Every file is read and checked
    before the first PNG is written."""
    splits = {s: read_split(staging / RAW_DIR / img, staging / RAW_DIR / lab) for s, (img, lab) in FILES.items()}
    paths, labels, names = [], [], []
    with tqdm(
        total=sum(len(lab) for _, lab in splits.values()), desc="write PNGs", unit="img", disable=not progress
    ) as bar:
        for split, (images, labs) in splits.items():
            for c in range(NUM_CLASSES):
                (staging / "images" / split / str(c)).mkdir(parents=True, exist_ok=True)
            for i, (img, lab) in enumerate(zip(images, labs.tolist())):
                rel = f"images/{split}/{lab}/{i:05d}.png"
                save_png(Image.fromarray(img, "L"), staging / rel)
                paths.append(rel)
                labels.append(lab)
                names.append(split)
                bar.update(1)
    return Rows(paths, labels, names)
