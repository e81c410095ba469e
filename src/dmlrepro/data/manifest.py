"""The manifest: one CSV per prepared dataset, ``<root>/<name>/manifest.csv``.

Schema (stable; header row required, column order as below):

=========  ======  ==========================================================================
column     type    meaning
=========  ======  ==========================================================================
path       str     image path, POSIX, relative to the folder that holds ``manifest.csv``
label      int     class id >= 0, global over the whole dataset (classes of different splits
                   never share an id, except in MNIST/Fashion-MNIST, whose train and test hold
                   the same 10 classes); CUB/Cars/SOP: the official class id - 1
split      str     ``train`` | ``test`` (zero-shot split; MNIST/Fashion-MNIST: the official
                   files); In-Shop: ``train`` | ``query`` | ``gallery``
item_id    str     optional; In-Shop's original item id (``id_00000002``)
=========  ======  ==========================================================================

The manifest is the completion marker of a prepared dataset: it is written atomically, last.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..atomic import atomic_write_text

MANIFEST_NAME = "manifest.csv"
REQUIRED_COLUMNS = ("path", "label", "split")
SPLITS = ("train", "test", "query", "gallery")


class ManifestError(ValueError):
    """A manifest file is missing or malformed."""


@dataclass
class Manifest:
    """In-memory manifest: parallel arrays, one entry per image, in file order."""

    root: Path  # folder the relative paths are resolved against
    paths: list[str]
    labels: np.ndarray  # int64
    splits: np.ndarray  # str
    item_ids: list[str] | None = None
    source: Path | None = field(default=None, compare=False)

    def __len__(self) -> int:
        return len(self.paths)

    def indices(self, split: str | Sequence[str]) -> np.ndarray:
        """Row indices of the given split name(s), in file order."""
        names = [split] if isinstance(split, str) else list(split)
        return np.flatnonzero(np.isin(self.splits, names))

    def classes(self, split: str | Sequence[str] | None = None) -> np.ndarray:
        """Sorted class ids of a split (all classes if None)."""
        labels = self.labels if split is None else self.labels[self.indices(split)]
        return np.unique(labels)

    def abspath(self, i: int) -> Path:
        return self.root / self.paths[i]

    def counts(self) -> dict[str, int]:
        """Image and class counts overall and per split (what the registry checks)."""
        out = {"images": len(self), "classes": int(len(np.unique(self.labels)))}
        for s in SPLITS:
            idx = self.indices(s)
            if len(idx):
                out[f"{s}_images"] = int(len(idx))
                out[f"{s}_classes"] = int(len(np.unique(self.labels[idx])))
        return out


def write_manifest(
    path: str | os.PathLike,
    paths: Sequence[str],
    labels: Sequence[int],
    splits: Sequence[str],
    item_ids: Sequence[str] | None = None,
) -> Path:
    """Validate and write a manifest atomically; returns its path."""
    path = Path(path)
    n = len(paths)
    if not (len(labels) == n and len(splits) == n and (item_ids is None or len(item_ids) == n)):
        raise ManifestError(
            f"{path}: columns have different lengths ({n} paths, {len(labels)} labels, {len(splits)} splits)"
        )
    bad = sorted(set(splits) - set(SPLITS))
    if bad:
        raise ManifestError(f"{path}: unknown split name(s) {bad}; expected one of {SPLITS}")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    header = list(REQUIRED_COLUMNS) + (["item_id"] if item_ids is not None else [])
    w.writerow(header)
    for i in range(n):
        p = str(paths[i]).replace(os.sep, "/")
        if p.startswith("/") or ".." in p.split("/"):
            raise ManifestError(f"{path}: image path {p!r} must be relative and inside the dataset folder")
        lab = int(labels[i])
        if lab < 0:
            raise ManifestError(f"{path}: negative label {lab} for {p!r}")
        row = [p, lab, splits[i]] + ([item_ids[i]] if item_ids is not None else [])
        w.writerow(row)
    atomic_write_text(path, buf.getvalue())
    return path


def read_manifest(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Manifest:
    """Read and validate a manifest. ``path`` may be the CSV or the dataset folder holding it."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"{path}: manifest not found; prepare the dataset first (dmlrepro prepare NAME --root DIR)")
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise ManifestError(f"{path}: empty file; expected header {','.join(REQUIRED_COLUMNS)}") from None
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise ManifestError(
                f"{path}: missing column(s) {missing}; header is {header}, expected {list(REQUIRED_COLUMNS)}"
            )
        ip, il, isp = (header.index(c) for c in REQUIRED_COLUMNS)
        ii = header.index("item_id") if "item_id" in header else None
        paths, labels, splits, items = [], [], [], []
        for lineno, row in enumerate(reader, start=2):
            if len(row) != len(header):
                raise ManifestError(f"{path}:{lineno}: {len(row)} fields, expected {len(header)}")
            try:
                lab = int(row[il])
            except ValueError:
                raise ManifestError(f"{path}:{lineno}: label {row[il]!r} is not an integer") from None
            if row[isp] not in SPLITS:
                raise ManifestError(f"{path}:{lineno}: split {row[isp]!r}, expected one of {SPLITS}")
            paths.append(row[ip])
            labels.append(lab)
            splits.append(row[isp])
            if ii is not None:
                items.append(row[ii])
    return Manifest(
        root=Path(root) if root is not None else path.parent,
        paths=paths,
        labels=np.asarray(labels, dtype=np.int64),
        splits=np.asarray(splits, dtype=object).astype(str),
        item_ids=items if ii is not None else None,
        source=path,
    )


def check_counts(manifest: Manifest, expected: dict[str, int], dataset_label: str) -> None:
    """Compare ``manifest.counts()`` with the expected counts; raise naming every mismatch."""
    got = manifest.counts()
    bad = [f"{k}: expected {v}, got {got.get(k, 0)}" for k, v in expected.items() if got.get(k, 0) != v]
    if bad:
        raise ManifestError(
            f"{dataset_label}: the prepared data does not have the counts the papers state ({'; '.join(bad)}). "
            "The archive is probably incomplete or a different version; re-download it, or pass "
            "--no-strict-counts (strict_counts=False) to accept these counts deliberately."
        )
