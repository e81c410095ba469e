"""Run-config resolution: defaults filled from one place, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dmlrepro.train import DEFAULTS, ConfigError, load_run_config, resolve_run_config

REPO = Path(__file__).resolve().parents[2]


def test_defaults_filled_and_partial_kept():
    cfg = resolve_run_config({"optimizer": {"lr": 0.01, "lr_mult": {"loss": 100}}, "epochs": 7})
    assert cfg["optimizer"]["lr"] == 0.01 and cfg["epochs"] == 7
    assert cfg["optimizer"]["lr_mult"] == {"backbone": 1.0, "head": 1.0, "loss": 100}
    assert cfg["optimizer"]["name"] == DEFAULTS["optimizer"]["name"]
    assert set(cfg) == set(DEFAULTS)
    # the input is not modified and DEFAULTS are not mutated
    assert DEFAULTS["optimizer"]["lr_mult"]["loss"] == 1.0


def test_yaml_exponent_without_dot_is_a_number():
    cfg = resolve_run_config(yaml.safe_load("optimizer: {lr: 1e-4, weight_decay: 5e-4}"))
    assert cfg["optimizer"]["lr"] == pytest.approx(1e-4) and isinstance(cfg["optimizer"]["lr"], float)


@pytest.mark.parametrize(
    "partial, key",
    [
        ({"optimizer": {"lr": -1}}, "optimizer.lr"),
        ({"optimizer": {"lr": 0}}, "optimizer.lr"),
        ({"optimizer": {"name": "adagrad"}}, "optimizer.name"),
        ({"optimizer": {"lr_mult": {"proxies": 100}}}, "optimizer.lr_mult.proxies"),
        ({"loss": {"name": "magic"}}, "loss.name"),
        ({"loss": {"name": "pfml", "hparams": {"deltaa": 0.2}}}, "loss.hparams"),
        ({"model": {"backbone": "resnet9000"}}, "model.backbone"),
        ({"model": {"pretrained": "no_such_weights"}}, "model.pretrained"),
        ({"dataset": {"name": "imagenet"}}, "dataset.name"),
        ({"dataset": {"sampler": "m_per_class", "m": 3, "batch_size": 32}}, "dataset.batch_size"),
        ({"schedule": {"name": "exp"}}, "schedule.name"),
        ({"epochs": 0}, "epochs"),
        ({"warmup_epochs": 3, "epochs": 3}, "warmup_epochs"),
        ({"followup": {"epochs": 1, "loss": {"alpha": 2.0}}}, "followup.loss.alpha"),  # pfml has alpha? see below
        ({"grad_clip": {"value": 10, "groups": ["trunk"]}}, "grad_clip.groups"),
        ({"eval": {"select": "best_val"}}, "eval.select"),
        ({"eval": {"select": "best_test", "every": 0}}, "eval.every"),
        ({"eval": {"ks": [2, 4]}}, "eval.ks"),
        ({"amp": {"enabled": "yes"}}, "amp.enabled"),
        ({"device": "tpu"}, "device"),
        ({"optimiser": {"lr": 1}}, "optimiser"),
        ({"dataset": {"batchsize": 1}}, "batchsize"),
        ({"deterministic": "true"}, "deterministic"),
    ],
)
def test_errors_name_the_key(partial, key):
    if key == "followup.loss.alpha":  # pfml has a plain `alpha`; a name that does not exist must fail
        partial = {"followup": {"epochs": 1, "loss": {"alphaa": 2.0}}}
        key = "followup.loss.alphaa"
    with pytest.raises(ConfigError) as info:
        resolve_run_config(partial)
    assert key in str(info.value)


def test_followup_attribute_of_rsw_accepted():
    cfg = resolve_run_config(
        {
            "loss": {"name": "rsw", "hparams": {"alpha": 28.4, "k1": 0.93, "k2": 1.15}},
            "epochs": 5,
            "followup": {"epochs": 2, "loss": {"alpha": 24.68, "k1": 0.95}, "lr": 1e-3},
        }
    )
    assert cfg["followup"]["loss"] == {"alpha": 24.68, "k1": 0.95}


def test_example_config_resolves():
    cfg = resolve_run_config(load_run_config(REPO / "config" / "run_example.yaml"))
    assert cfg["dataset"]["name"] in ("synthetic", "digits")


def test_load_rejects_non_mapping(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=str(p)):
        load_run_config(p)
