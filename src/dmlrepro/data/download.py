"""HTTP download with resume (HTTP Range) or clean restart, and md5 verification.

Standard library only (urllib). The bytes go to ``<dest>.part``; only a complete file whose md5
matches is renamed to ``<dest>``, so ``<dest>`` existing means "downloaded and verified".
"""

from __future__ import annotations

import hashlib
import http.client
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm.auto import tqdm

CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A download failed (network, server, incomplete body)."""


class ChecksumError(DownloadError):
    """A file's md5 is not the expected one."""


class _Restart(Exception):
    """Internal: the partial file cannot be resumed; start again from byte 0."""


def md5sum(path: str | os.PathLike, progress: bool = False) -> str:
    h = hashlib.md5()
    path = Path(path)
    with (
        open(path, "rb") as fh,
        tqdm(
            total=path.stat().st_size,
            unit="B",
            unit_scale=True,
            desc=f"md5 {path.name}",
            disable=not progress,
            leave=False,
        ) as bar,
    ):
        for block in iter(lambda: fh.read(CHUNK), b""):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


def verify_md5(path: str | os.PathLike, md5: str | None, hint: str = "", progress: bool = False) -> None:
    """Raise ChecksumError naming the file, the expected and the actual md5, and what to do."""
    if md5 is None:
        return
    got = md5sum(path, progress=progress)
    if got.lower() != md5.lower():
        raise ChecksumError(
            f"{path}: md5 is {got}, expected {md5}. The file is corrupt, truncated or a different "
            f"version. {hint or 'Delete it and download it again.'}"
        )


def _fetch(url: str, part: Path, timeout: float, progress: bool) -> None:
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "dmlrepro-data/1"}
    if have:
        headers["Range"] = f"bytes={have}-"
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # range not satisfiable: the partial file is unusable
            raise _Restart() from e
        raise
    with resp:
        status = getattr(resp, "status", None) or 200
        if have and status == 206:
            crange = resp.headers.get("Content-Range", "")
            if not crange.startswith(f"bytes {have}-"):
                raise _Restart()
            mode = "ab"
        else:  # server ignored the Range header (or no partial file): restart from byte 0
            have, mode = 0, "wb"
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        done = have
        with (
            open(part, mode) as fh,
            tqdm(
                total=total,
                initial=have,
                unit="B",
                unit_scale=True,
                desc=part.name[: -len(".part")],
                disable=not progress,
                leave=False,
            ) as bar,
        ):
            while True:
                try:
                    block = resp.read(CHUNK)
                except http.client.IncompleteRead as e:
                    fh.write(e.partial)
                    raise DownloadError(f"connection closed after {done + len(e.partial)} of {total} bytes") from e
                if not block:
                    break
                fh.write(block)
                done += len(block)
                bar.update(len(block))
    if total is not None and done != total:
        raise DownloadError(f"connection closed after {done} of {total} bytes")


def download(
    url: str,
    dest: str | os.PathLike,
    md5: str | None = None,
    *,
    retries: int = 3,
    timeout: float = 60.0,
    backoff: float = 1.0,
    progress: bool = True,
) -> Path:
    """Download ``url`` to ``dest``; resume an existing ``dest.part`` when the server allows it.

    Verifies ``md5`` (if given) before ``dest`` appears. A wrong md5 deletes the partial file
    (it cannot be repaired by resuming) and raises ChecksumError.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    last: BaseException | None = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * attempt)
        try:
            _fetch(url, part, timeout, progress)
            last = None
            break
        except _Restart:
            part.unlink(missing_ok=True)
            last = DownloadError("server could not resume the partial file; restarted")
        except urllib.error.HTTPError as e:
            last = e
            if 400 <= e.code < 500 and e.code not in (408, 429):
                break  # not found / forbidden: retrying will not help
        except (DownloadError, urllib.error.URLError, http.client.HTTPException, OSError) as e:
            last = e
    if last is not None:
        kept = f" The partial file {part} is kept; rerun to resume." if part.exists() else ""
        raise DownloadError(
            f"{url}: download of {dest.name} failed ({last}).{kept} If the URL is dead, download "
            f"the file by other means and place it at {dest} (or pass its path with --archive)."
        ) from last
    try:
        verify_md5(
            part,
            md5,
            progress=progress,
            hint=f"The partial download was deleted; rerun to download {url} again, or place a good copy at {dest}.",
        )
    except ChecksumError as e:
        part.unlink(missing_ok=True)
        raise ChecksumError(str(e).replace(str(part), f"{dest} (downloaded from {url})")) from None
    os.replace(part, dest)
    return dest
