"""``dmlrepro fetch-weights NAME [NAME ...] --cache-dir DIR``: put pretrained weights into
the cache once, on a machine with internet access (training nodes read the cache only).

Wiring into the top-level CLI: either call :func:`main` with the arguments after
``fetch-weights``, or use :func:`add_arguments` on a subparser and :func:`run` as handler.
"""

from __future__ import annotations

import argparse
import sys

from .backbones import BACKBONES, resolve_backbone_name
from .weights import WEIGHTS, WeightsError, fetch_weights, get_weight_spec

__all__ = ["main", "add_arguments", "run", "build_parser"]


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="weight name (see --list) or backbone name (fetches its default weights)",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="weight cache directory (default: $DMLREPRO_WEIGHTS or ~/.cache/dmlrepro/weights)",
    )
    parser.add_argument("--url", default=None, help="download from this URL instead (one NAME only)")
    parser.add_argument(
        "--sha256",
        default=None,
        help="expected sha256 (full or >= 8-hex prefix) instead of the registry's (one NAME only)",
    )
    parser.add_argument(
        "--allow-unverified",
        action="store_true",
        help="allow downloading weights for which no checksum is known (the digest is recorded)",
    )
    parser.add_argument("--force", action="store_true", help="download again even if cached")
    parser.add_argument("--timeout", type=float, default=60.0, help="network timeout in seconds")
    parser.add_argument("--list", action="store_true", help="list the known weights and exit")
    return parser


def build_parser(prog: str = "dmlrepro fetch-weights") -> argparse.ArgumentParser:
    return add_arguments(argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0]))


def _weight_name(name: str) -> str:
    if name in WEIGHTS:
        return name
    try:
        backbone = resolve_backbone_name(name)
    except KeyError:
        raise KeyError(f"unknown weights or backbone {name!r}; weights: {', '.join(sorted(WEIGHTS))}") from None
    default = BACKBONES[backbone].default_weights
    if default is None:
        raise KeyError(f"backbone {name!r} has no pretrained weights to fetch")
    return default


def _list(out) -> None:
    for name in sorted(WEIGHTS):
        spec = get_weight_spec(name)
        if spec.sha256:
            check = f"sha256 {spec.sha256}"
        elif spec.sha256_prefix:
            check = f"sha256 prefix {spec.sha256_prefix}"
        else:
            check = "no checksum known"
        print(f"{name}\n    {spec.url}\n    file {spec.filename}; {check}", file=out)


def run(args: argparse.Namespace) -> int:
    if args.list:
        _list(sys.stdout)
        return 0
    if not args.names:
        print("error: give at least one NAME (or --list)", file=sys.stderr)
        return 2
    if (args.url or args.sha256) and len(args.names) != 1:
        print("error: --url and --sha256 apply to a single NAME", file=sys.stderr)
        return 2
    status = 0
    for raw in args.names:
        try:
            name = _weight_name(raw)
            path = fetch_weights(
                name,
                args.cache_dir,
                url=args.url,
                sha256=args.sha256,
                allow_unverified=args.allow_unverified,
                force=args.force,
                timeout=args.timeout,
            )
        except (KeyError, ValueError, WeightsError, OSError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            print(f"error: {raw}: {msg}", file=sys.stderr)
            status = 1
            continue
        print(f"{name}: {path}")
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point; ``argv`` excludes the program name (a leading ``fetch-weights`` is skipped)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "fetch-weights":
        argv = argv[1:]
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
