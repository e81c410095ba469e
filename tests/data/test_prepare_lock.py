"""Two processes preparing one dataset folder take turns (``dmlrepro.data.prepared.preparation_lock``).

Found by ``dmlrepro preflight --workers 2``: two shapes prepared the same generated dataset at once
and the second one's ``unprepare`` deleted the first one's staging folder while it was written."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from filelock import FileLock

from dmlrepro.data.decoded import read_decoded
from dmlrepro.data.manifest import read_manifest
from dmlrepro.data.prepared import LOCK_NAME

pytestmark = pytest.mark.slow  # two subprocesses that import torch (to decode): ~11 s

PREPARE = (
    "from dmlrepro.data.registry import prepare; "
    "prepare('synthetic', {root!r}, progress=False, force=True, num_classes=4, images_per_class=8)"
)


def test_a_second_preparation_waits_for_the_first_then_both_succeed(tmp_path):
    lock = FileLock(tmp_path / "synthetic" / LOCK_NAME)
    lock.acquire()  # a preparation under way
    procs = [
        subprocess.Popen([sys.executable, "-c", PREPARE.format(root=str(tmp_path))], stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    time.sleep(2)
    assert all(p.poll() is None for p in procs)  # both wait ...
    assert not list((tmp_path / "synthetic").glob(".staging-*"))  # ... before touching the folder
    lock.release()
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert all("is being prepared by another process; waiting" in e for e in errors)
    manifest = read_manifest(tmp_path / "synthetic" / "manifest.csv")
    decoded = read_decoded(tmp_path / "synthetic")
    assert len(manifest) == len(decoded) == 4 * 8 and all(manifest.abspath(i).is_file() for i in range(len(manifest)))
