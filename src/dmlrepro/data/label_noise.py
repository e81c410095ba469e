"""Static symmetric label noise for PFML Table 2 (main §4.3; docs/readings/pfml.md#pfml-r23).

``round(rate * n)`` training samples, chosen uniformly without replacement, get a new label drawn
uniformly from the *other* training classes (``mode="other"``, the reading) or from all
training classes (``mode="any"``). The draw depends only on the
training rows of the manifest (in file order; a run with a class-disjoint validation split: its
training rows only), ``seed``, ``rate`` and ``mode`` — so every method at a given seed sees the same
corrupted file.

File format (CSV, one row per training image, manifest order): ``path,label,noisy_label``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..atomic import atomic_write_text
from .manifest import Manifest, ManifestError, read_manifest
from .splits import has_validation_split


def corrupt_labels(
    labels: Sequence[int], seed: int, rate: float = 0.2, mode: Literal["other", "any"] = "other"
) -> np.ndarray:
    """Return a copy of ``labels`` with ``round(rate * n)`` entries replaced (see module doc)."""
    labels = np.asarray(labels, dtype=np.int64)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"label noise rate {rate} outside [0, 1]")
    if mode not in ("other", "any"):
        raise ValueError(f"label noise mode {mode!r}, expected 'other' or 'any'")
    classes = np.unique(labels)
    if mode == "other" and len(classes) < 2:
        raise ValueError("label noise mode 'other' needs at least 2 training classes")
    n = len(labels)
    k = int(round(rate * n))
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x6E6F697365]))  # "noise"
    chosen = np.sort(rng.choice(n, size=k, replace=False))
    noisy = labels.copy()
    if mode == "any":
        noisy[chosen] = classes[rng.integers(0, len(classes), size=k)]
    else:
        # Uniform over the other C-1 classes: draw a position in [0, C-1) and skip the true class.
        true_position = np.searchsorted(classes, labels[chosen])
        draw = rng.integers(0, len(classes) - 1, size=k)
        noisy[chosen] = classes[draw + (draw >= true_position)]
    return noisy


def label_noise_path(dataset_cfg: Mapping[str, Any], rows: Sequence[int] | None = None) -> Path:
    """Where the seeded noisy labels of a run's `dataset.label_noise` live: beside the dataset's manifest;
    over a subset of the training rows (`rows`: a validation split's training rows), named by their digest."""
    n = dataset_cfg["label_noise"]
    path = label_noise_file(dataset_cfg["root"], dataset_cfg["name"], f"{n['rate']:g}", n["seed"], n["mode"])
    if rows is None:
        return path
    digest = hashlib.sha256(np.asarray(rows, dtype=np.int64).tobytes()).hexdigest()[:10]
    return path.with_name(f"{path.stem}_rows{digest}.csv")


def prepared_noise_file(dataset_cfg: Mapping[str, Any], validation_cfg: Mapping[str, Any] | None) -> Path | None:
    """The noisy-label file of the whole training split, which the workflow writes before the run; None
    without label noise, or with a validation split: the run then corrupts its own training rows only and
    writes that file itself (PFML Table 2 corrupts the labels a run trains on, never a held-out class's)."""
    if dataset_cfg["label_noise"] is None or has_validation_split(validation_cfg):
        return None
    return label_noise_path(dataset_cfg)


def label_noise_file(root: str | os.PathLike, dataset: str, rate: str, seed: Any, mode: str) -> Path:
    """The one spelling of a noisy-label file's path (`rate` printed as `{:g}` prints it, or a
    Snakemake wildcard: rule label_noise's output)."""
    return Path(root) / dataset / "label_noise" / f"rate{rate}_seed{seed}_{mode}.csv"


def write_noisy_labels(
    manifest: Manifest | str | os.PathLike,
    out: str | os.PathLike,
    seed: int,
    rate: float = 0.2,
    mode: Literal["other", "any"] = "other",
    split: str = "train",
    rows: Sequence[int] | None = None,
) -> Path:
    """Write the corrupted-label file for the ``split`` rows of a manifest, or for its `rows` only (a
    class-disjoint validation's training rows: no label moves to a held-out class), atomically."""
    m = manifest if isinstance(manifest, Manifest) else read_manifest(manifest)
    idx = m.indices(split)
    if not len(idx):
        raise ManifestError(f"{m.source}: no rows with split {split!r} to corrupt")
    if rows is not None:
        outside = np.setdiff1d(rows, idx)
        if len(outside):
            raise ManifestError(f"{m.source}: rows {outside[:3].tolist()} are not {split!r} rows")
        idx = np.asarray(rows, dtype=np.int64)
    labels = m.labels[idx]
    noisy = corrupt_labels(labels, seed, rate, mode)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["path", "label", "noisy_label"])
    for i, lab, nl in zip(idx, labels, noisy):
        w.writerow([m.paths[i], int(lab), int(nl)])
    atomic_write_text(out, buf.getvalue())
    return Path(out)


def read_noisy_labels(path: str | os.PathLike) -> dict[str, int]:
    """Map image path -> noisy label from a file written by ``write_noisy_labels``."""
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: noisy-label file not found")
    with open(path, newline="", encoding="utf-8") as fh:
        r = csv.DictReader(fh)
        if r.fieldnames is None or not {"path", "noisy_label"} <= set(r.fieldnames):
            raise ManifestError(f"{path}: header {r.fieldnames}, expected path,label,noisy_label")
        try:
            return {row["path"]: int(row["noisy_label"]) for row in r}
        except ValueError as e:
            raise ManifestError(f"{path}: non-integer noisy_label ({e})") from None
