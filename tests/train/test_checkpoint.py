"""Checkpoint files: verified on load, damaged files skipped (renamed), rotation, temporaries."""

from __future__ import annotations

import pytest
import torch

from dmlrepro.train import CheckpointError, list_checkpoints, load_latest, read_checkpoint, save_checkpoint
from dmlrepro.train.checkpoint import checkpoint_name


def _state(v: float) -> dict:
    return {"w": torch.full((50,), v), "position": {"epoch": int(v)}, "rng": [1, 2, 3]}


def test_round_trip_rotation_and_order(tmp_path):
    for e in (1, 2, 3):
        save_checkpoint(tmp_path, _state(e), epoch=e, batch=0, keep=2)
    save_checkpoint(tmp_path, _state(9), epoch=3, batch=12, keep=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == [checkpoint_name(3, 0), checkpoint_name(3, 12)]  # newest two, chronological
    state, path = load_latest(tmp_path)
    assert path.name == checkpoint_name(3, 12) and torch.equal(state["w"], torch.full((50,), 9.0))
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "header", "empty"])
def test_damaged_newest_falls_back_to_previous(tmp_path, damage, capsys):
    save_checkpoint(tmp_path, _state(1), epoch=2, batch=0)
    newest = save_checkpoint(tmp_path, _state(2), epoch=3, batch=0)
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 7]
    elif damage == "flip":
        data[-20] ^= 0xFF
    elif damage == "header":
        data[:8] = b"PK\x03\x04xxxx"
    else:
        data = bytearray()
    newest.write_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        read_checkpoint(newest)
    state, path = load_latest(tmp_path)
    assert path.name == checkpoint_name(2, 0) and torch.equal(state["w"], torch.full((50,), 1.0))
    assert (tmp_path / (newest.name + ".corrupt")).exists() and not newest.exists()
    assert "cannot be used" in capsys.readouterr().out


def test_nothing_usable_returns_none(tmp_path):
    assert load_latest(tmp_path / "missing") is None
    p = save_checkpoint(tmp_path, _state(1), epoch=2, batch=0)
    p.write_bytes(p.read_bytes()[:100])
    assert load_latest(tmp_path) is None
