"""Where a preflight takes its data and weights from: the prepared dataset and the weight cache
when they are there, otherwise stand-ins that keep the run's tensor shapes.

A stand-in benchmark is a prepared-layout folder (``manifest.csv``) whose training split has the
real benchmark's image and class counts (``dmlrepro.data.benchmarks``: the loss gets the real
number of classes, the sampler the real epoch length) over a handful of distinct JPEG files at the
configured size, each listed many times; its test (or query / gallery) split is small, enough for
one evaluation. Embedded datasets (``synthetic``, ``digits``) are generated as the engine
generates them, from the run's ``dataset.params``, into the preflight's own folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from dmlrepro.data.benchmarks import BENCHMARKS
from dmlrepro.data.manifest import MANIFEST_NAME, write_manifest
from dmlrepro.data.multidigit import (
    DEFAULTS as MULTIDIGIT_DEFAULTS,
    SPECS as MULTIDIGIT,
    expected_counts as multidigit_counts,
)
from dmlrepro.data.prepared import is_prepared
from dmlrepro.data.registry import EMBEDDED
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK
from dmlrepro.models import get_backbone_spec, resolve_backbone_name
from dmlrepro.models.weights import default_cache_dir, fetch_command, weight_path

#: distinct stand-in image files per dataset (each listed many times by the manifest)
DISTINCT_IMAGES = 8
#: stand-in images per evaluation split (test, or query and gallery), two per class
EVAL_IMAGES = 64


@dataclass(frozen=True)
class DataSource:
    """Where one run's data comes from: ``root`` and ``prepare`` for its dataset config, and a note
    for the output (None: the prepared dataset)."""

    root: str
    prepare: bool
    note: str | None


def data_source(dataset_cfg: dict[str, Any], data_root: str | Path, scratch: Path) -> DataSource:
    """The prepared dataset under ``data_root`` when it is there, else a stand-in under ``scratch``."""
    name = dataset_cfg["name"]
    if name in EMBEDDED:  # generated from the run's own dataset.params, never into the data root
        return DataSource(str(scratch), True, f"{name} generated in a scratch folder")
    if is_prepared(data_root, name):
        return DataSource(str(data_root), False, None)
    counts = stand_in_counts(dataset_cfg)
    if counts is None:
        raise KeyError(f"dataset {name!r} is neither prepared under {data_root} nor a known benchmark")
    size = stand_in_size(dataset_cfg)
    if not (scratch / name / MANIFEST_NAME).is_file():
        write_stand_in(scratch, name, size, counts)
    return DataSource(
        str(scratch),
        False,
        f"stand-in images ({size}×{size} JPEG; {name} is not prepared under {data_root}): real counts, not real pixels",
    )


def stand_in_size(dataset_cfg: dict[str, Any]) -> int:
    """The configured size: the largest of the crop, the eval resize and the train resize."""
    return max(
        int(dataset_cfg["image_size"]), int(dataset_cfg.get("resize") or 0), int(dataset_cfg.get("train_resize") or 0)
    )


def stand_in_counts(dataset_cfg: dict[str, Any]) -> dict[str, int] | None:
    """The training counts a stand-in keeps: a benchmark's, or a multi-digit set's protocol at the run's
    ``dataset.params.images_per_class`` (docs/data.md#multi-digit-mnist); None for an unknown dataset."""
    name = dataset_cfg["name"]
    if name in MULTIDIGIT:
        params = {**MULTIDIGIT_DEFAULTS, **(dataset_cfg.get("params") or {})}
        return multidigit_counts(name, int(params["images_per_class"]))
    return BENCHMARKS[name].expected_counts if name in BENCHMARKS else None


def write_stand_in(root: Path, name: str, size: int, counts: dict[str, int] | None = None) -> Path:
    """``<root>/<name>/manifest.csv`` in the prepared layout with the training ``counts`` (default: the
    benchmark's)."""
    counts = counts or BENCHMARKS[name].expected_counts
    folder = root / name
    (folder / "images").mkdir(parents=True, exist_ok=True)
    files = [f"images/{i}.jpg" for i in range(DISTINCT_IMAGES)]
    for i, path in enumerate(files):
        _write_jpeg(folder / path, i, size)
    n_train, n_classes = counts["train_images"], counts["train_classes"]
    # class j holds the j-th block of rows: every class has floor or ceil of n_train / n_classes images
    labels = [i * n_classes // n_train for i in range(n_train)]
    splits = ["train"] * n_train
    # held-out classes after the training ones, two images each (the same classes for query and gallery)
    eval_splits = ["query", "gallery"] if "query_images" in counts else ["test"]
    for split in eval_splits:
        per_split = EVAL_IMAGES // len(eval_splits)
        labels += [n_classes + i // 2 for i in range(per_split)]
        splits += [split] * per_split
    paths = [files[i % DISTINCT_IMAGES] for i in range(len(labels))]
    return write_manifest(folder / MANIFEST_NAME, paths, labels, splits)


def _write_jpeg(path: Path, seed: int, size: int) -> None:
    """A smooth colour field plus grain: compresses and decodes roughly like a photograph."""
    rng = np.random.default_rng(seed)
    low = rng.integers(0, 256, (max(size // 16, 2), max(size // 16, 2), 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(low).resize((size, size), Image.BILINEAR), dtype=np.int16)
    img = np.clip(img + rng.integers(-12, 13, img.shape, dtype=np.int16), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(path, "JPEG", quality=90)


def missing_weights(mcfg: dict[str, Any]) -> str | None:
    """The weight name a model config asks for when its file is not in the cache, else None."""
    pretrained = mcfg.get("pretrained")
    if not pretrained:
        return None
    if pretrained == DIGIT_TRUNK.key:  # built by rule pretrain_digit_trunk (docs/models.md)
        folder = mcfg.get("weights_cache_dir") or default_cache_dir()
        return None if DIGIT_TRUNK.weights_file(folder, mcfg.get(DIGIT_TRUNK.key)).is_file() else DIGIT_TRUNK.key
    name = (
        get_backbone_spec(resolve_backbone_name(str(mcfg["backbone"]))).default_weights
        if pretrained is True
        else str(pretrained)
    )
    if name is None:
        return None
    return None if weight_path(name, mcfg.get("weights_cache_dir")).is_file() else name


def weights_warning(name: str, cache_dir: str | None = None) -> str:
    """The one line printed per missing weight file."""
    if name == DIGIT_TRUNK.key:
        where = f" in {cache_dir}" if cache_dir else ""
        return (
            f"warning: the {DIGIT_TRUNK.title} is not built yet{where} (rule pretrain_{DIGIT_TRUNK.key}): "
            "the preflight uses random initialisation"
        )
    return (
        f"warning: pretrained weights {name!r} are not in the cache ({weight_path(name, cache_dir)}): "
        f"the preflight uses random initialisation; fetch them with `{fetch_command(name, cache_dir)}`"
    )
