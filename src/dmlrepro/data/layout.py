"""The data-layout types of the benchmark registry: a benchmark, the files it is made from, the
rows its layout reader returns, and the errors of preparing it (dmlrepro.data.benchmarks holds the
benchmarks, their layout readers and the prepare driver; docs/data.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


class LayoutError(RuntimeError):
    """The extracted files do not have the layout of the official release."""


class MissingFileError(FileNotFoundError):
    """A file that cannot be downloaded has not been placed where expected."""


@dataclass(frozen=True)
class Resource:
    filename: str
    md5: str | None
    urls: tuple[str, ...] = ()
    extract_to: str | None = "."  # folder (relative to the dataset folder) to extract into; None: copy as is
    place_at: str | None = None  # for non-archives: relative path the file is copied to


@dataclass(frozen=True)
class Rows:
    paths: list[str]
    labels: list[int]
    splits: list[str]
    item_ids: list[str] | None = None


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    resources: tuple[Resource, ...]
    read_layout: Callable[..., Rows]  # (staging folder, *, progress) -> rows
    expected_counts: Mapping[str, int]
    placement: str  # what to place where, shown in errors and docs
