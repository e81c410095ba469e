"""dmlrepro.atomic: a written file has the mode a plain open() gives it (0666 less the umask), and the
rename is made durable by an fsync of its folder."""

from __future__ import annotations

import os
import stat

import pytest

from dmlrepro import atomic


@pytest.fixture
def umask():
    """Set the process's umask inside one test."""
    before = os.umask(0o022)
    os.umask(before)
    yield lambda mask: os.umask(mask)
    os.umask(before)


@pytest.mark.parametrize("mask", [0o002, 0o022, 0o027, 0o077])
@pytest.mark.parametrize(
    "write",
    [
        lambda p: atomic.atomic_write_text(p, "x"),
        lambda p: atomic.atomic_write_bytes(p, b"x"),
        lambda p: atomic.write_json_atomic(p, {"a": 1}),
    ],
)
def test_a_written_file_has_the_mode_open_gives_it(tmp_path, umask, mask, write):
    umask(mask)
    with open(tmp_path / "plain", "w"):
        pass
    write(tmp_path / "atomic")
    assert stat.S_IMODE((tmp_path / "atomic").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "atomic").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)


def test_the_umask_is_read_without_changing_it(umask):
    umask(0o027)
    assert atomic.current_umask() == 0o027
    assert os.umask(0o027) == 0o027  # still what it was


def test_the_folder_is_fsynced_after_the_rename(tmp_path, monkeypatch):
    events = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(os, "replace", lambda *a: (events.append("replace"), real_replace(*a))[1])

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic.atomic_write_text(tmp_path / "sub" / "out.txt", "x")
    assert events == ["fsync file", "replace", "fsync folder"]
    assert (tmp_path / "sub" / "out.txt").read_text() == "x"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.txt"
    atomic.atomic_write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic.atomic_open(target) as handle:
            handle.write("new")
            raise RuntimeError
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
