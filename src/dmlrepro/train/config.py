"""The run config: one nested mapping (loaded from YAML) describing one training run.

Its keys, with their defaults, checks and meanings, are the table ``config_keys.KEYS`` (docs/training.md
shows it); ``resolve_run_config`` deep-merges a partial config onto ``DEFAULTS``, runs every key's own
check, then the checks that involve several keys, and returns the fully resolved config that the
engine writes to ``<outdir>/config.yaml``. Errors are :class:`ConfigError` (a ``ValueError``) whose
message names the key, the value and what was expected, and they are raised before any data is
prepared or any model is built.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dmlrepro.config_names import loss_catalog
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK, DigitTrunkError
from dmlrepro.nested import canonical

from .config_checks import GROUPS, ConfigError, check_loss_hparam_types, config_error, read_yaml
from .config_keys import (
    DEFAULTS,
    FREE_MAPPINGS,
    KEYS,
    KEYS_BY_NAME,
    LATE_DEFAULTS,
    OPTIMIZERS,
    RETIRED_KEYS,
    RUNTIME_KEYS,
    SCHEDULES,
)

__all__ = [
    "DEFAULTS",
    "GROUPS",
    "OPTIMIZERS",
    "SCHEDULES",
    "ConfigError",
    "RUNTIME_KEYS",
    "load_run_config",
    "resolve_run_config",
    "config_identity",
    "dump_yaml",
    "LATE_DEFAULTS",
    "without_late_defaults",
    "without_retired_keys",
    "section_value",
    "corruption_suffix",
]


def without_late_defaults(cfg: Mapping[str, Any]) -> dict:
    """A copy of ``cfg`` without the ``LATE_DEFAULTS`` keys that hold their default value.

    Keys inside a section go first; a whole late section (``(None, name)``) is then compared with its
    default less its own late keys, so a section written before one of them existed (a run
    directory's config.yaml) and one written after are the same identity."""
    out = copy.deepcopy(dict(cfg))
    nested = [(s, k, d) for (s, k), d in LATE_DEFAULTS.items() if s is not None]
    for section, key, default in nested:
        node = out.get(section)
        if isinstance(node, dict) and key in node and node[key] == default:
            node.pop(key)
    for (section, key), default in LATE_DEFAULTS.items():
        if section is not None or key not in out:
            continue
        if isinstance(default, Mapping):
            default = {k: v for k, v in default.items() if (key, k) not in LATE_DEFAULTS}
        if out[key] == default:
            out.pop(key)
    return out


def without_retired_keys(cfg: Mapping[str, Any]) -> dict:
    """A copy of ``cfg`` without the ``RETIRED_KEYS`` that hold their retired value (a config.yaml written
    while they existed: ``dmlrepro evaluate`` resolves it); at another value they stay, and the merge refuses
    them as unknown keys. A run's identity needs no such step: a null and an absent key are the same
    (``resume.first_difference``)."""
    out = copy.deepcopy(dict(cfg))
    for (section, key), value in RETIRED_KEYS.items():
        node = out if section is None else out.get(section)
        if isinstance(node, dict) and key in node and node[key] == value:
            node.pop(key)
    return out


def section_value(section: Mapping[str, Any], key: str) -> Any:
    """The value of dotted ``key`` ("validation.fraction") in its ``section`` of a resolved config, or
    its default where a stored identity (config.yaml, a report's run record) dropped it as a late default."""
    return section.get(key.rpartition(".")[2], KEYS_BY_NAME[key].default)


def _merge(base: dict, override: Mapping, prefix: str = "") -> dict:
    """``override`` deep-merged onto ``base``: an unknown key is an error, a free mapping (a loss's
    hparams) is taken as given."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        path = f"{prefix}{key}"
        if key not in base:
            raise ConfigError(f"run config: unknown key {path!r}; expected one of {sorted(base)}")
        if isinstance(base[key], dict) and path not in FREE_MAPPINGS:
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise config_error(path, value, "a mapping")
            out[key] = _merge(base[key], value, path + ".")
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_each_key(cfg: dict) -> None:
    """Every key's own check (config_keys.KEYS), in the table's order; values are replaced by the
    checked ones (a number read as a string becomes a float)."""
    for key in KEYS:
        *sections, last = key.name.split(".")
        node = cfg
        for section in sections:
            node = node[section]
        node[last] = key.check(key.name, node[last])


# -- checks that involve several keys ----------------------------------------------------------------
def _check_dataset(cfg: dict) -> None:
    dataset = cfg["dataset"]
    if dataset["sampler"] == "m_per_class" and dataset["batch_size"] % dataset["m"]:
        raise config_error(
            "dataset.batch_size",
            dataset["batch_size"],
            f"a multiple of dataset.m = {dataset['m']} (sampler m_per_class)",
        )
    if dataset["label_noise"] is not None and dataset["label_noise_file"] is not None:
        raise config_error("dataset.label_noise", dataset["label_noise"], "null when dataset.label_noise_file is given")
    if dataset["gallery_split"] is not None and dataset["gallery_split"] == dataset["test_split"]:
        raise config_error(
            "dataset.gallery_split", dataset["gallery_split"], "a split other than dataset.test_split, or null"
        )


def _resolve_pretraining(cfg: dict) -> None:
    """model.digit_trunk: the recipe of the trunk a run fine-tunes from, resolved in place
    (docs/models.md#the-digit-pretrained-trunk); null (ignored, not part of the run id) unless
    ``pretrained: digit_trunk``, e.g. when a preflight swaps in random initialisation."""
    model, key = cfg["model"], DIGIT_TRUNK.key
    if model["pretrained"] != key:
        model[key] = None
        return
    if model[key] is not None and not isinstance(model[key], Mapping):
        raise config_error(f"model.{key}", model[key], "a mapping (the trunk's pretraining recipe) or null")
    try:
        model[key] = DIGIT_TRUNK.resolve(model[key])
    except DigitTrunkError as e:
        raise ConfigError(f"run config: {e}") from None
    if model[key]["backbone"] != model["backbone"]:
        raise config_error(f"model.{key}.backbone", model[key]["backbone"], f"the run's backbone {model['backbone']!r}")
    if model[key]["backbone_kwargs"] != dict(model["backbone_kwargs"] or {}):
        raise config_error(
            f"model.{key}.backbone_kwargs",
            model[key]["backbone_kwargs"],
            f"the run's model.backbone_kwargs {dict(model['backbone_kwargs'] or {})}",
        )


def _fill_loss_hparams(cfg: dict) -> None:
    """The hyperparameters the loss declares as config defaults, where the config does not give them (the
    loss's own defaults cover the rest; the resolved config records the value used)."""
    loss = cfg["loss"]
    declared = loss_catalog()[0][loss["name"]]["config_defaults"]
    loss["hparams"] = {**copy.deepcopy(declared), **loss["hparams"]}


def _check_phases(cfg: dict) -> None:
    """Warm-up and the followup phase are shorter than the run."""
    epochs, followup = cfg["epochs"], cfg["followup"]
    if cfg["warmup_epochs"] >= epochs:
        raise config_error("warmup_epochs", cfg["warmup_epochs"], f"fewer than epochs = {epochs}")
    if followup["epochs"] >= epochs:
        cap = " (with trigger plateau: a cap on phase 2, 0 = none)" if followup["trigger"] == "plateau" else ""
        raise config_error("followup.epochs", followup["epochs"], f"fewer than epochs = {epochs}{cap}")


def _check_eval(cfg: dict) -> None:
    evaluation = cfg["eval"]
    if evaluation["normalize"] == "lipschitz" and evaluation["distance"] == "cosine":  # cosine undoes v / max(1, ‖v‖)
        raise config_error(
            "eval.normalize", "lipschitz", "eval.distance: euclidean (cosine re-normalises every vector)"
        )
    if evaluation["select"] == "best_test" and evaluation["every"] == 0:
        raise config_error("eval.every", 0, "a positive interval when eval.select is best_test")
    if evaluation["proxy_metrics"] and evaluation["select"] != "last":
        raise config_error(
            "eval.proxy_metrics",
            evaluation["proxy_metrics"],
            "an empty list with eval.select best_test (they describe the final proxies)",
        )
    if evaluation["proxy_metrics_per_epoch"] and not evaluation["proxy_metrics"]:
        raise config_error("eval.proxy_metrics_per_epoch", True, "false, or a non-empty eval.proxy_metrics to log")
    if evaluation["corruptions"] and (evaluation["select"] != "last" or cfg["dataset"]["gallery_split"] is not None):
        raise config_error(
            "eval.corruptions",
            evaluation["corruptions"],
            "an empty list with eval.select best_test "
            "or a dataset.gallery_split (they evaluate the final model on the test split alone)",
        )


def _check_validation(cfg: dict) -> None:
    """validation.*: a class-disjoint split of the training classes, and what selects on it."""
    validation = cfg["validation"]
    if validation["fold"] >= validation["n_folds"]:
        raise config_error(
            "validation.fold", validation["fold"], f"a fold index below validation.n_folds = {validation['n_folds']}"
        )
    if validation["split"] is None:
        if cfg["eval"]["select"] == "best_val":
            raise config_error("eval.select", "best_val", "'last' or 'best_test' without a validation.split")
        if validation["patience"] is not None:
            raise config_error("validation.patience", validation["patience"], "null without a validation.split")
    elif cfg["dataset"]["train_split"] != "train":
        raise config_error(
            "dataset.train_split",
            cfg["dataset"]["train_split"],
            "'train' with a validation.split (the validation classes are taken from it)",
        )


def _check_asap(cfg: dict) -> None:
    """asap.enabled: ASAP Alg. 1 needs a loss whose proxies it sets (asap_*; for asap.proxies samples, one whose
    proxies can be samples) and a validation split to alternate on."""
    if not cfg["asap"]["enabled"]:
        return
    declared = loss_catalog()[0][cfg["loss"]["name"]]
    if not declared["sets_proxies"]:
        raise config_error(
            "asap.enabled", True, f"false for loss {cfg['loss']['name']!r} (ASAP needs an asap_* proxy loss)"
        )
    if cfg["asap"]["proxies"] == "samples" and not declared["sample_proxies"]:
        raise config_error(
            "asap.proxies", "samples", f"'trainable' for loss {cfg['loss']['name']!r} (its proxies cannot be samples)"
        )
    if cfg["validation"]["split"] is None:
        raise config_error(
            "asap.enabled",
            True,
            "false without a validation.split (alternations follow validation MAP@R; set validation.split: fold)",
        )
    if cfg["eval"]["select"] == "best_test":
        raise config_error("eval.select", "best_test", "'best_val' or 'last' with asap.enabled")


def _check_followup_trigger(cfg: dict) -> None:
    """followup.trigger plateau (RSW App. D): phase 2 starts when validation patience runs out, so it
    needs a validation split and patience."""
    if cfg["followup"]["trigger"] != "plateau":
        return
    validation = cfg["validation"]
    if validation["split"] is None:
        raise config_error(
            "followup.trigger",
            "plateau",
            "'epochs' without a validation.split (phase 2 starts "
            "when validation stops improving; set validation.split and validation.patience)",
        )
    if validation["patience"] is None:
        raise config_error(
            "followup.trigger",
            "plateau",
            "'epochs' without a validation.patience (the evaluations without improvement that end each phase)",
        )
    if cfg["asap"]["enabled"]:
        raise config_error(
            "followup.trigger", "plateau", "'epochs' with asap.enabled (ASAP's schedule owns the early stop)"
        )


def _check_loss(cfg: dict) -> None:
    """Build the loss once on a toy size: unknown hyperparameters and followup attributes fail here.
    Runs that share these keys share the check (a workflow resolves hundreds of runs, few losses)."""
    loss_cfg, followup = cfg["loss"], cfg["followup"]
    _check_loss_once(
        json.dumps(
            canonical(
                {"loss": loss_cfg, "followup_loss": followup["loss"], "embedding_size": cfg["model"]["embedding_size"]}
            )
        )
    )
    if followup["loss"] and followup["epochs"] == 0 and followup["trigger"] == "epochs":
        raise config_error("followup.epochs", 0, "a positive number of epochs when followup.loss is set")


@functools.lru_cache(maxsize=256)
def _check_loss_once(keys: str) -> None:
    import torch  # deferred: only this check needs it

    from dmlrepro.losses import build_loss  # deferred: imports torch

    keys = json.loads(keys)
    loss_cfg = keys["loss"]
    check_loss_hparam_types(loss_cfg["name"], loss_cfg["hparams"])
    try:
        loss = build_loss(loss_cfg["name"], 4, keys["embedding_size"] or 8, **dict(loss_cfg["hparams"]))
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"run config: loss.hparams = {dict(loss_cfg['hparams'])!r} for loss {loss_cfg['name']!r}: {e}"
        ) from None
    for attr, value in keys["followup_loss"].items():
        if (
            attr.startswith("_")
            or not hasattr(loss, attr)
            or callable(getattr(loss, attr))
            or isinstance(getattr(loss, attr), torch.Tensor)
        ):
            raise config_error(f"followup.loss.{attr}", value, f"a plain attribute of loss {loss_cfg['name']!r}")


#: In this order, after every key's own check.
CROSS_KEY_CHECKS = (
    _check_dataset,
    _resolve_pretraining,
    _fill_loss_hparams,
    _check_phases,
    _check_eval,
    _check_validation,
    _check_asap,
    _check_followup_trigger,
    _check_loss,
)


# -- public ----------------------------------------------------------------------------------------
def load_run_config(path: str | os.PathLike) -> dict:
    """Read a YAML run config (a mapping) from ``path``; not resolved."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run config file not found: {path}")
    data = read_yaml(path, "run config")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: a run config must be a YAML mapping, got {type(data).__name__}")
    return dict(data)


def resolve_run_config(partial: Mapping[str, Any] | None) -> dict:
    """Fill defaults into ``partial`` and validate every value; returns a new dict.

    Cheap checks only (no data, no model weights): names of dataset, backbone, loss and
    optimizer, numeric ranges, consistency (m divides batch_size, followup shorter than the run,
    best_test needs per-epoch evaluation, the loss accepts its hyperparameters and the followup
    attributes exist on it).
    """
    if partial is None:
        partial = {}
    if not isinstance(partial, Mapping):
        raise ConfigError(f"run config must be a mapping, got {type(partial).__name__}")
    cfg = _merge(DEFAULTS, without_retired_keys(partial))
    _check_each_key(cfg)
    for check in CROSS_KEY_CHECKS:
        check(cfg)
    return cfg


def corruption_suffix(item: Mapping[str, Any]) -> str:
    """The metric suffix of one eval.corruptions entry: `gaussian_3`, or `gaussian` (default range)."""
    return item["name"] if item.get("severity") is None else f"{item['name']}_{item['severity']}"


def config_identity(cfg: Mapping[str, Any]) -> dict:
    """The resolved config without the runtime keys (what must match to resume a run)."""
    out = without_late_defaults(cfg)
    for section, key in RUNTIME_KEYS:
        node = out if section is None else out.get(section)
        if isinstance(node, dict):
            node.pop(key, None)
    return out


def dump_yaml(cfg: Mapping[str, Any]) -> str:
    return yaml.safe_dump(_plain(cfg), sort_keys=False, default_flow_style=None)


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
