"""Life cycle of a prepared dataset folder ``<root>/<name>/``.

A dataset is built in a hidden staging folder ``<root>/<name>/.staging-*``, validated there
(layout, counts), then its top-level entries are renamed into ``<root>/<name>/`` and the manifest
is written atomically, last. ``manifest.csv`` existing therefore means "completely prepared";
anything else in the folder without a manifest is leftover work that the next run replaces.
Preparations of one folder take turns (``preparation_lock``).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..atomic import atomic_write_text, remove_path
from .decoded import DECODED_NAME, write_decoded
from .manifest import MANIFEST_NAME, Manifest, ManifestError, check_counts, read_manifest, write_manifest

INFO_NAME = "prepare_info.json"
SIZES_NAME = "image_sizes.csv"  # path,height,width of every image, from the header read at preparation
LOCK_NAME = ".prepare.lock"
ARCHIVE_DIR = "archives"  # downloaded or user-placed archives, kept across runs


def dataset_dir(root: str | os.PathLike, name: str) -> Path:
    return Path(root) / name


def manifest_path(root: str | os.PathLike, name: str) -> Path:
    return dataset_dir(root, name) / MANIFEST_NAME


def is_prepared(root: str | os.PathLike, name: str) -> bool:
    return manifest_path(root, name).is_file()


def unprepare(ds_dir: Path) -> None:
    """Remove the completion marker first, then our info file and leftover staging folders.

    Extracted folders of an earlier run are replaced entry by entry by ``finalize``; files the
    user put into the folder (e.g. archives) are never deleted here.
    """
    remove_path(ds_dir / MANIFEST_NAME)
    remove_path(ds_dir / INFO_NAME)
    remove_path(ds_dir / SIZES_NAME)
    remove_path(ds_dir / DECODED_NAME)
    if ds_dir.is_dir():
        for child in ds_dir.iterdir():
            if child.name.startswith(".staging-"):
                remove_path(child)


@contextlib.contextmanager
def preparation_lock(ds_dir: Path) -> Iterator[None]:
    """One preparation of a dataset folder at a time (``<folder>/.prepare.lock``, an flock the
    kernel releases when its holder dies). Without it a second process's ``unprepare`` deleted the
    first one's staging folder mid-write (two preflight shapes preparing the same generated
    dataset); now the second waits, then finds the dataset prepared."""
    from filelock import FileLock, Timeout  # deferred: only preparation takes the lock

    ds_dir.mkdir(parents=True, exist_ok=True)
    if not os.access(ds_dir, os.W_OK):  # read-only: nobody prepares here, a prepared dataset is only read
        yield
        return
    lock = FileLock(ds_dir / LOCK_NAME)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"{ds_dir} is being prepared by another process; waiting for it to end", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def new_staging(ds_dir: Path) -> Path:
    ds_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".staging-", dir=ds_dir))


def discard_staging(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def finalize(
    ds_dir: Path,
    staging: Path,
    paths: Sequence[str],
    labels: Sequence[int],
    splits: Sequence[str],
    item_ids: Sequence[str] | None = None,
    *,
    expected_counts: dict[str, int] | None = None,
    strict_counts: bool = True,
    info: dict | None = None,
) -> Path:
    """Validate the staged dataset, move it into ``ds_dir`` and write the manifest last.

    Checks that every listed image exists and, with ``strict_counts``, that the counts equal
    ``expected_counts``. On failure nothing is moved and the staging folder is removed.
    """
    try:
        for p in paths:
            if not (staging / p).is_file():
                raise FileNotFoundError(
                    f"{ds_dir.name}: image {p!r} is listed by the dataset's index files but missing from "
                    "the extracted archive; the archive is incomplete or a different version. "
                    "Delete it and download it again."
                )
        sizes = _check_images(ds_dir.name, staging, paths)
        _write_image_sizes(staging / SIZES_NAME, paths, sizes)
        write_decoded(staging, paths, sizes)
        # Validate by writing the manifest inside the staging folder, then reading it back.
        staged_manifest = write_manifest(staging / MANIFEST_NAME, paths, labels, splits, item_ids)
        manifest = read_manifest(staged_manifest)
        if strict_counts and expected_counts:
            check_counts(manifest, expected_counts, dataset_label=f"dataset {ds_dir.name!r} in {ds_dir}")
        counts = manifest.counts()
        for child in staging.iterdir():
            if child.name == MANIFEST_NAME:
                continue
            target = ds_dir / child.name
            remove_path(target)  # leftover of an interrupted earlier run (no manifest)
            os.replace(child, target)
        atomic_write_text(
            ds_dir / INFO_NAME, json.dumps({**(info or {}), "counts": counts}, indent=2, sort_keys=True) + "\n"
        )
        os.replace(staged_manifest, ds_dir / MANIFEST_NAME)  # the completion marker, last
    finally:
        discard_staging(staging)
    return ds_dir / MANIFEST_NAME


def _check_images(name: str, staging: Path, paths: Sequence[str]) -> list[tuple[int, int]]:
    """Every listed image must at least open as an image (header only, no decoding: about 50 µs a
    file). A file that exists but is not an image (an HTML error page saved as .jpg, a zero-byte
    file) is reported here, naming the file, instead of as a decode error in the middle of
    training (docs/bad-input.md). Returns each image's (height, width)."""
    from PIL import Image, UnidentifiedImageError  # deferred: PIL, only the image check needs it

    sizes = []
    for p in paths:
        try:
            with Image.open(staging / p) as im:
                if min(im.size) < 1:
                    raise ValueError(f"size {im.size}")
                sizes.append((im.size[1], im.size[0]))
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise ManifestError(
                f"{name}: image {p!r} is not a readable image ({type(e).__name__}: {e}); expected an image file. "
                "The archive is corrupt or a different version. Delete it and download it again."
            ) from None
    return sizes


def _write_image_sizes(path: Path, paths: Sequence[str], sizes: Sequence[tuple[int, int]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(("path", "height", "width"))
    writer.writerows((p, h, w) for p, (h, w) in zip(paths, sizes))
    path.write_text(buf.getvalue())


def read_image_sizes(folder: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """path -> (height, width) of the images of a prepared dataset folder, as read from their
    headers at preparation; empty for a folder prepared before the sizes were recorded (or by hand)."""
    try:
        with open(Path(folder) / SIZES_NAME, newline="") as fh:
            rows = list(csv.reader(fh))
    except OSError:
        return {}
    try:
        return {p: (int(h), int(w)) for p, h, w in rows[1:]}
    except ValueError:  # an unreadable record: the headers are read instead
        return {}


def load_prepared(root: str | os.PathLike, name: str) -> Manifest:
    """The prepared manifest, refused when its totals differ from those recorded at preparation
    (``prepare_info.json``): a manifest cut at a line end (a crash of a non-atomic writer, a partial
    copy) still parses, and training would silently use fewer images.
    Totals only: a split may be re-labelled on purpose (query/gallery)."""
    manifest = read_manifest(manifest_path(root, name))
    info_path = dataset_dir(root, name) / INFO_NAME
    try:
        recorded = json.loads(info_path.read_text()).get("counts")
    except (OSError, ValueError, AttributeError):
        return manifest  # nothing recorded to compare with (e.g. a dataset prepared by hand)
    got = manifest.counts()
    if isinstance(recorded, dict) and any(recorded.get(k) != got[k] for k in ("images", "classes")):
        bad = "; ".join(
            f"{k}: {got[k]} (manifest) vs {recorded.get(k)} (prepared)"
            for k in ("images", "classes")
            if got[k] != recorded.get(k)
        )
        raise ManifestError(
            f"{manifest.source} does not match {info_path} ({bad}): the manifest is truncated "
            f"or was edited; prepare the dataset again (delete {manifest.source}, or "
            f"`dmlrepro prepare {name} --root {root} --force`)"
        )
    return manifest
