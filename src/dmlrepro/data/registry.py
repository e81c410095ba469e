"""Registry of datasets by the names used in config, and one ``prepare`` entry point.

=============  =================================  ==========================================
name           dataset                            source
=============  =================================  ==========================================
cub200         CUB-200-2011                       downloaded (data.caltech.edu), md5 checked
cars196        Cars-196                           user URL or user-placed files, md5 checked
sop            Stanford Online Products           downloaded (Stanford FTP) or placed, md5
inshop         In-Shop Clothes Retrieval          user-placed files (no md5 published)
mnist          MNIST handwritten digits           downloaded (torchvision's S3 mirror) or a local copy, md5
fashion_mnist  Fashion-MNIST (Zalando)            downloaded (Zalando's S3 bucket) or a local copy, md5
synthetic      generated fine-grained shapes      generated from a seed, no network
digits         scikit-learn handwritten digits    shipped with scikit-learn, no network
double_mnist   Multi-digit MNIST, two digits      made from a prepared mnist or a local MNIST copy
triple_mnist   Multi-digit MNIST, three digits    made from a prepared mnist or a local MNIST copy
double_digits  two scikit-learn digits            shipped with scikit-learn, no network
=============  =================================  ==========================================

MNIST and Fashion-MNIST keep the official train/test files: the same 10 classes in both splits
(not a zero-shot split).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from .benchmarks import BENCHMARKS, prepare_benchmark
from .digits import EXPECTED as DIGITS_EXPECTED, prepare_digits
from .manifest import Manifest
from .multidigit import DEFAULTS as MULTIDIGIT_DEFAULTS, SPECS as MULTIDIGIT, expected_counts, prepare_multidigit
from .prepared import dataset_dir, is_prepared, load_prepared, manifest_path, preparation_lock
from .synthetic import DEFAULTS as SYNTHETIC_DEFAULTS, prepare_synthetic

EMBEDDED = ("synthetic", "digits", "double_digits")
DATASETS = tuple(BENCHMARKS) + EMBEDDED + ("double_mnist", "triple_mnist")


def expected_train_images(name: str, params: Mapping | None = None) -> int:
    """A dataset's training images before it is prepared: a benchmark's published count, synthetic's
    from its parameters (the first half of `num_classes` × `images_per_class`), scikit-learn's digits 0-4."""
    if name in BENCHMARKS:
        return BENCHMARKS[name].expected_counts["train_images"]
    if name == "synthetic":
        p = {**SYNTHETIC_DEFAULTS, **{k: v for k, v in (params or {}).items() if v is not None}}
        return int(p["num_classes"]) // 2 * int(p["images_per_class"])
    if name in MULTIDIGIT:
        p = {**MULTIDIGIT_DEFAULTS, **{k: v for k, v in (params or {}).items() if v is not None}}
        return expected_counts(name, int(p["images_per_class"]))["train_images"]
    _check_known(name)
    return DIGITS_EXPECTED["train_images"]


def describe(name: str) -> str:
    if name in BENCHMARKS:
        b = BENCHMARKS[name]
        return f"{b.title}: {b.placement}"
    return {
        "synthetic": "generated fine-grained shapes (seeded, no network)",
        "digits": "scikit-learn handwritten digits, upsampled (no network)",
        "double_digits": "two scikit-learn digits side by side, classes 00-99 (no network)",
        "double_mnist": "Multi-digit MNIST, classes 00-99, from a prepared mnist or --from a local MNIST copy",
        "triple_mnist": "Multi-digit MNIST, classes 000-999, from a prepared mnist or --from a local MNIST copy",
    }[name]


def prepare(
    name: str,
    root: str | os.PathLike,
    *,
    urls: Sequence[str] | None = None,
    archives: Sequence[str] | None = None,
    md5: Mapping[str, str | None] | None = None,
    strict_counts: bool = True,
    force: bool = False,
    progress: bool = True,
    source: str | os.PathLike | None = None,
    **params,
) -> Path:
    """Prepare dataset ``name`` under ``<root>/<name>/`` and return its manifest path.

    Benchmarks: ``urls`` / ``archives`` override where files come from, ``md5`` overrides the
    expected md5 per file name (None: skip), ``strict_counts`` asserts the papers' counts; ``source``
    (mnist, fashion_mnist): a local copy of the IDX files instead of the download (docs/data.md).
    ``synthetic``: ``seed``, ``num_classes``, ``images_per_class``, ``size``, ``modes``,
    ``family_size``. ``digits``: ``size``. ``double_mnist``, ``triple_mnist`` (``source``, ``md5`` as
    mnist's ``--from``), ``double_digits``: ``seed``, ``images_per_class``. An already prepared dataset
    is reused unless ``force``.
    Two processes preparing the same folder take turns; the second then reuses the first's work.
    """
    _check_known(name)
    with preparation_lock(dataset_dir(root, name)):
        return _prepare(
            name,
            root,
            urls=urls,
            archives=archives,
            md5=md5,
            strict_counts=strict_counts,
            force=force,
            progress=progress,
            source=source,
            **params,
        )


def _prepare(name, root, *, urls, archives, md5, strict_counts, force, progress, source, **params) -> Path:
    if name in BENCHMARKS:
        if params:
            raise TypeError(f"dataset {name!r} takes no parameters {sorted(params)}")
        return prepare_benchmark(
            BENCHMARKS[name],
            root,
            urls=urls,
            archives=archives,
            md5=md5,
            strict_counts=strict_counts,
            force=force,
            progress=progress,
            source=source,
        )
    if name in MULTIDIGIT:
        if urls or archives:
            raise TypeError(f"dataset {name!r} is made from MNIST's digits; it takes --from, not urls or archives")
        return prepare_multidigit(
            name, root, source=source, md5=md5, force=force, progress=progress, strict_counts=strict_counts, **params
        )
    if urls or archives or md5 or source is not None:
        raise TypeError(f"dataset {name!r} is embedded; it takes no urls, archives, md5 or --from")
    if name == "synthetic":
        return prepare_synthetic(root, force=force, progress=progress, **params)
    # the last embedded dataset (prepare checked the name)
    return prepare_digits(root, force=force, progress=progress, strict_counts=strict_counts, **params)


def source_arguments(name: str, source: Mapping | None) -> dict:
    """The :func:`prepare` arguments of a workflow config's ``sources.<name>`` entry (its keys ``url``,
    ``archive``: one or a list; ``md5``: file -> md5 or None to skip; ``strict_counts``): where a
    benchmark's files come from, never part of a run's identity (docs/workflow.md#config)."""
    if not source:
        return {}
    if name not in BENCHMARKS:
        raise ValueError(
            f"config sources.{name}: not a dataset whose files are fetched; expected one of {', '.join(BENCHMARKS)}"
        )
    listed = {"url": "urls", "archive": "archives"}
    args = {
        listed[key]: [value] if isinstance(value, str) else list(value)
        for key, value in source.items()
        if key in listed
    }
    if "md5" in source:
        args["md5"] = dict(source["md5"])
    if "strict_counts" in source:
        args["strict_counts"] = bool(source["strict_counts"])
    return args


def check_sources(sources: Mapping[str, Mapping]) -> None:
    """Every entry of a workflow config's ``sources`` names a benchmark (a ValueError naming it otherwise)."""
    for name, source in sources.items():
        source_arguments(name, source)


def load(name: str, root: str | os.PathLike) -> Manifest:
    """The manifest of a prepared dataset (raises ManifestError naming the file if not prepared)."""
    _check_known(name)
    return load_prepared(root, name)


def _check_known(name: str) -> None:
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")


__all__ = [
    "DATASETS",
    "EMBEDDED",
    "check_sources",
    "describe",
    "prepare",
    "load",
    "is_prepared",
    "manifest_path",
    "source_arguments",
]
