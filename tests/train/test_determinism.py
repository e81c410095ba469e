"""The data stream is a function of (seed, epoch, batch, position): DataLoader workers do not
change the result (each sample is augmented under its own seed), and the seed does."""

from __future__ import annotations

import json

import pytest
import torch

from dmlrepro.train import list_checkpoints, read_checkpoint, train_run


def _final(outdir):
    return read_checkpoint(list_checkpoints(outdir / "checkpoints")[-1]), json.loads(
        (outdir / "metrics.json").read_text()
    )


@pytest.mark.slow
def test_num_workers_do_not_change_the_result_but_the_seed_does(tiny, tmp_path):
    common = dict(epochs=2, steps_per_epoch=3, dataset__hflip=0.5, eval={"every": 0, "before_training": False})
    train_run(tiny(**common, num_workers=0), tmp_path / "w0", progress=False)
    train_run(tiny(**common, num_workers=2), tmp_path / "w2", progress=False)
    train_run(tiny(**common, seed=4), tmp_path / "s4", progress=False)
    (a, ma), (b, mb), (c, _) = _final(tmp_path / "w0"), _final(tmp_path / "w2"), _final(tmp_path / "s4")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert torch.equal(a["loss"]["proxies"], b["loss"]["proxies"])
    assert ma["metrics"] == mb["metrics"]
    assert not torch.equal(a["loss"]["proxies"], c["loss"]["proxies"])
    assert any(not torch.equal(a["model"][k], c["model"][k]) for k in a["model"] if a["model"][k].is_floating_point())
