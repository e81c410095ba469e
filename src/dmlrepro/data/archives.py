"""Safe extraction of .tgz/.tar/.zip archives into a temporary folder.

The caller renames what it needs out of the temporary folder only after validating it, so an
interrupted or failed extraction never leaves a half-filled dataset folder.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from tqdm.auto import tqdm


class ArchiveError(RuntimeError):
    """An archive cannot be read completely (truncated, corrupt, unsafe member paths)."""


def _check_member(archive: Path, name: str) -> None:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts:
        raise ArchiveError(f"{archive}: unsafe member path {name!r} (absolute or with '..'); refusing to extract")


def extract_to_temp(archive: str | os.PathLike, parent: str | os.PathLike, progress: bool = True) -> Path:
    """Extract ``archive`` into a new hidden temporary folder under ``parent`` and return it.

    Raises ArchiveError (and removes the temporary folder) when the archive is truncated,
    corrupt or unsafe.
    """
    archive, parent = Path(archive), Path(parent)
    if not archive.is_file():
        raise ArchiveError(f"{archive}: archive not found")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".extract-{archive.name}-", dir=parent))
    try:
        if archive.suffix.lower() == ".zip" and not zipfile.is_zipfile(archive):
            raise ArchiveError(
                f"{archive}: not a complete .zip archive (no readable central directory); it is truncated "
                "or corrupt. Delete it and download it again."
            )
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                infos = zf.infolist()
                for info in tqdm(infos, desc=f"extract {archive.name}", unit="file", disable=not progress, leave=False):
                    _check_member(archive, info.filename)
                    zf.extract(info, tmp)  # raises BadZipFile on a CRC mismatch
        else:
            try:
                tf = tarfile.open(archive, "r:*")
            except tarfile.ReadError as e:
                raise ArchiveError(
                    f"{archive}: not a readable .zip or .tar(.gz) archive ({e}); it is truncated or corrupt, "
                    "or not the expected file. Delete it and download it again."
                ) from None
            with tf:
                for member in tqdm(tf, desc=f"extract {archive.name}", unit="file", disable=not progress, leave=False):
                    _check_member(archive, member.name)
                    if member.issym() or member.islnk() or member.isdev():
                        continue  # datasets hold plain files only
                    tf.extract(member, tmp, filter="data")
    except ArchiveError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ArchiveError(
            f"{archive}: extraction failed ({type(e).__name__}: {e}); the archive is truncated or "
            "corrupt. Delete it and download it again (or place a good copy there)."
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp
