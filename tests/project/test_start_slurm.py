""".ci/start-slurm gives the CI node the host's real GPUs where it has some, and makes fake device
nodes (mknod, nvidia's char major 195) only where there is no GPU and no driver: never a second,
world-writable /dev entry for a real GPU (docs/slurm.md#the-ci-cluster)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "start-slurm"


def print_gres(dev: Path, bin_dir: Path, nvidia_smi: int | None, **env: str) -> list[str]:
    """The script's --print-gres with its GPUs looked for in ``dev`` and an nvidia-smi that exits
    with ``nvidia_smi`` (None: there is none)."""
    bin_dir.mkdir(exist_ok=True)
    if nvidia_smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nexit {nvidia_smi}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    path = str(bin_dir) + os.pathsep + ("/usr/bin:/bin" if nvidia_smi is None else os.environ["PATH"])
    done = subprocess.run(
        ["bash", str(SCRIPT), "--print-gres"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PATH": path, "START_SLURM_DEV": str(dev), **env},
    )
    return done.stdout.splitlines()


def test_real_gpus_are_used_and_nothing_is_made(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (dev / name).touch()
    fake, gres, *files = print_gres(dev, tmp_path / "bin", nvidia_smi=0)
    assert fake == "fake: none" and gres == "gres: Gres=gpu:3"
    assert [line.split()[-1] for line in files] == [f"File={dev}/nvidia{i}" for i in range(3)]
    assert sorted(p.name for p in dev.iterdir()) == [
        "nvidia-modeset",
        "nvidia-uvm",
        "nvidia0",
        "nvidia1",
        "nvidia2",
        "nvidiactl",
    ]


@pytest.mark.parametrize(
    "nvidia_smi, no_mknod, expected",
    [(None, "0", "mknod"), (1, "0", "mknod"), (0, "0", "symlink"), (None, "1", "symlink")],
)
def test_fake_gpus_only_where_there_is_no_gpu(tmp_path, nvidia_smi, no_mknod, expected):
    """No /dev/nvidiaN: fake nodes with mknod if no driver answers either (nvidia-smi missing or
    failing); a driver without device files (a container) or refused mknod gets /dev/null symlinks."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidiactl").touch()  # not a GPU
    fake, gres, files = print_gres(dev, tmp_path / "bin", nvidia_smi, START_SLURM_NO_MKNOD=no_mknod)
    assert fake == f"fake: {expected}" and gres == "gres: Gres=gpu:2"
    assert files.endswith({"mknod": f"File={dev}/fakegpu[0-1]", "symlink": "File=/run/dmlrepro-fakegpu[0-1]"}[expected])
