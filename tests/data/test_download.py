from __future__ import annotations

import os

import pytest

from dmlrepro.data.download import ChecksumError, DownloadError, download, md5sum

from .conftest import md5_of

DATA = bytes(range(256)) * 400


def test_resume_with_range(tmp_path, server):
    server.files["f.bin"] = DATA
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(DATA[:1000])
    download(server.url + "f.bin", dest, md5_of(DATA), progress=False)
    assert dest.read_bytes() == DATA and not (tmp_path / "f.bin.part").exists()
    assert server.requests == [("f.bin", "bytes=1000-")]


def test_restart_when_range_ignored(tmp_path, server):
    server.files["f.bin"] = DATA
    server.mode["f.bin"] = "norange"
    (tmp_path / "f.bin.part").write_bytes(b"garbage-prefix")
    download(server.url + "f.bin", tmp_path / "f.bin", md5_of(DATA), progress=False)
    assert (tmp_path / "f.bin").read_bytes() == DATA


def test_404_fails_fast_with_advice(tmp_path, server):
    with pytest.raises(DownloadError, match=r"404.*place it at"):
        download(server.url + "missing.bin", tmp_path / "missing.bin", progress=False, backoff=0)
    assert len(server.requests) == 1  # not retried
    assert not os.listdir(tmp_path)


def test_checksum_mismatch_removes_partial(tmp_path, server):
    server.files["f.bin"] = DATA
    with pytest.raises(ChecksumError, match=r"f.bin \(downloaded from http://127.0.0.1:\d+/f.bin\): md5 is") as e:
        download(server.url + "f.bin", tmp_path / "f.bin", "0" * 32, progress=False)
    assert "expected " + "0" * 32 in str(e.value)
    assert not os.listdir(tmp_path)


def test_md5sum():
    import hashlib
    import tempfile

    with tempfile.NamedTemporaryFile() as f:
        f.write(DATA)
        f.flush()
        assert md5sum(f.name) == hashlib.md5(DATA).hexdigest()
