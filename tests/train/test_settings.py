"""RunSettings (dmlrepro.train.settings): each field is the value of its key in the resolved run
config (docs/training.md's key table), read once; the config itself is left as it was."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from dmlrepro.train.config import resolve_run_config
from dmlrepro.train.settings import RunSettings

#: a value for every key the settings read, none of them its default
CONFIG = {
    "dataset": {"name": "digits", "batch_size": 24, "eval_batch_size": 100},
    "model": {"backbone": "tiny_cnn", "l2_normalize": False},
    "loss": {"name": "rsw"},
    "followup": {"epochs": 2, "loss": {"alpha": 20.0}},
    "amp": {"enabled": "auto"},
    "epochs": 7,
    "steps_per_epoch": 5,
    "seed": 11,
    "num_workers": 3,
    "eval": {
        "select": "last",
        "before_training": False,
        "proxy_metrics": ["avg_dtp"],
        "proxy_metrics_per_epoch": True,
        "corruptions": [{"name": "gaussian", "severity": 2}],
    },
    "checkpoint": {"keep": 4},
    "speed": {
        "sync_every": 6,
        "channels_last": True,
        "tf32": True,
        "image_cache_mb": 9,
        "checkpoint_overhead": 0.5,
        "checkpoint_floor_mb": 2,
    },
}


def test_every_field_is_its_key():
    cfg = resolve_run_config(CONFIG)
    before = copy.deepcopy(cfg)
    s = RunSettings.of(cfg)
    assert dataclasses.asdict(s) == {
        "seed": 11,
        "epochs": 7,
        "steps_per_epoch": 5,
        "num_workers": 3,
        "batch_size": 24,
        "eval_batch_size": 100,
        "loss_name": "rsw",
        "validated": False,
        "asap": False,
        "sample_proxies": False,
        "followup_loss": {"alpha": 20.0},
        "followup_trigger": "epochs",
        "followup_epochs": 2,
        "amp_enabled": "auto",
        "select": "last",
        "before_training": False,
        "proxy_metrics": ["avg_dtp"],
        "proxy_metrics_per_epoch": True,
        "corruptions": [{"name": "gaussian", "severity": 2}],
        "gallery": False,
        "checkpoint_keep": 4,
        "sync_every": 6,
        "channels_last": True,
        "tf32": True,
        "image_cache_mb": 9,
        "checkpoint_overhead": 0.5,
        "checkpoint_floor_mb": 2,
    }
    assert cfg == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.epochs = 8


def test_a_gallery_split_is_gallery():
    dataset = {"name": "digits", "test_split": "query", "gallery_split": "gallery"}
    assert RunSettings.of(resolve_run_config({"dataset": dataset, "model": {"backbone": "tiny_cnn"}})).gallery


@pytest.mark.parametrize(
    ("asap", "validated", "sample_proxies"),
    [({"enabled": True}, True, False), ({"enabled": True, "proxies": "samples"}, True, True)],
)
def test_asap_and_validation_flags(asap, validated, sample_proxies):
    cfg = resolve_run_config(
        {
            "dataset": {"name": "digits"},
            "model": {"backbone": "tiny_cnn"},
            "loss": {"name": "asap_c2"},
            "validation": {"split": "fold"},
            "asap": asap,
        }
    )
    s = RunSettings.of(cfg)
    assert (s.asap, s.validated, s.sample_proxies) == (True, validated, sample_proxies)
