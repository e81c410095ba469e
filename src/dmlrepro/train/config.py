"""The run config: one nested mapping (loaded from YAML) describing one training run.

``DEFAULTS`` below is the single place where default values live; ``resolve_run_config``
deep-merges a partial config onto it, checks every key and value, and returns the fully
resolved config that the engine writes to ``<outdir>/config.yaml``. Errors are
:class:`ConfigError` (a ``ValueError``) whose message names the key, the value and what was
expected, and they are raised before any data is prepared or any model is built.

Every key is documented in docs/training.md.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULTS",
    "GROUPS",
    "LOSS_HPARAM_DEFAULTS",
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
]

#: Parameter groups of the optimizer: the trunk, the rest of the model, the loss's own
#: parameters (proxies, class weights).
GROUPS = ("backbone", "head", "loss")
OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")
SCHEDULES = ("none", "step", "cosine")
SAMPLERS = ("random", "m_per_class")
SELECT = ("last", "best_test", "best_val")
VALIDATION_SPLITS = ("fold", "holdout", "samples")
FOLD_SCHEMES = ("linspace", "mlrc")
DISTANCES = ("cosine", "euclidean")
PROXY_METRICS = ("w2", "avg_dtp")
ASAP_PROXIES = ("trainable", "samples")
FOLLOWUP_TRIGGERS = ("epochs", "plateau")

DEFAULTS: dict[str, Any] = {
    "dataset": {
        "name": "synthetic",
        "root": "data",
        "prepare": True,  # embedded datasets (synthetic, digits) are generated on first use
        "params": {},  # passed to dmlrepro.data.prepare for embedded datasets (e.g. num_classes)
        "train_split": "train",
        "test_split": "test",
        "gallery_split": None,  # In-Shop: test_split "query" retrieves from this split (query→gallery)
        "image_size": 32,
        "resize": None,  # eval resize (and train resize for train_crop: random); None = data default
        "resize_mode": "short",
        "train_crop": "rrc",  # rrc (RandomResizedCrop) | random (resize then RandomCrop)
        "train_resize": None,
        "scale": [0.08, 1.0],
        "ratio": [0.75, 1.3333333333333333],
        "hflip": 0.5,
        "normalization": "auto",  # auto = from the backbone's input convention
        "sampler": "random",  # random | m_per_class
        "m": 4,
        "length_before_new_iter": None,  # m_per_class: images per epoch (None = dataset size)
        "batch_size": 64,
        "eval_batch_size": 256,
        "label_noise_file": None,  # a noisy-label CSV (dmlrepro.data.write_noisy_labels) ...
        "label_noise": None,  # ... or {rate, seed, mode}: PFML Table 2's seeded corruption of the train labels
        "cache_images": False,  # keep each decoded image in memory after its first read (small datasets; speed only)
    },
    "model": {
        "backbone": "tiny_cnn",
        "pretrained": False,  # false | true (backbone's default weights) | a weight name | standin
        "standin": None,  # pretrained: standin: the stand-in's pretraining recipe (dmlrepro.models.standin)
        "preset": None,
        "pool": None,  # None = the preset's or the backbone's default
        "head": None,  # None = the preset's or "linear"
        "embedding_size": 64,
        "l2_normalize": True,
        "head_init": None,
        "head_bias": None,
        "mlp_hidden": None,
        "weights_cache_dir": None,
        "weights_sha256": None,
        "backbone_kwargs": {},
    },
    "loss": {"name": "pfml", "hparams": {}},
    "optimizer": {
        "name": "adam",
        "lr": 1e-4,
        "weight_decay": 0.0,
        "eps": None,  # None = torch's default for the optimizer (RSW: 1.0)
        "betas": [0.9, 0.999],
        "momentum": 0.0,  # sgd / rmsprop
        "alpha": 0.99,  # rmsprop smoothing constant
        "nesterov": False,
        "lr_mult": {"backbone": 1.0, "head": 1.0, "loss": 1.0},
        "wd_mult": {"backbone": 1.0, "head": 1.0, "loss": 1.0},
    },
    "schedule": {"name": "none", "step": 10, "gamma": 0.5, "min_lr_ratio": 0.0},
    "warmup_epochs": 0,
    "bn_freeze": {"running_stats": False, "affine": False, "unfreeze_affine_after_warmup": False},
    "grad_clip": {"value": None, "groups": list(GROUPS)},
    # RSW's second phase; trigger "epochs": the last followup.epochs epochs; "plateau" (RSW App. D): when
    # validation patience runs out (followup.epochs then caps phase 2; 0 = up to the epochs cap)
    "followup": {"epochs": 0, "loss": {}, "lr": None, "lr_mult": {}, "trigger": "epochs"},
    "amp": {"enabled": "auto", "dtype": "bfloat16"},
    "epochs": 3,
    "steps_per_epoch": None,  # cap on optimizer steps per epoch (None = the sampler's full epoch)
    "seed": 0,
    # deterministic algorithms: "auto" = on for the CPU, off on CUDA (docs/training.md#bit-exactness)
    "deterministic": "auto",
    "eval": {
        "every": 1,  # evaluate on the test split every n epochs (0 = only at the end)
        "before_training": True,  # epoch-0 row: the untrained network
        "ks": [1, 2, 4, 8],
        "distance": "cosine",
        "select": "last",  # last | best_test (by test recall@1; diagnostic, as in Proxy-Anchor's code)
        "nmi": False,  # true | false | {average, kmeans, n_init} (dmlrepro.evaluation.clustering.nmi_options)
        "normalize": "none",  # none | lipschitz (v / max(1, ‖v‖) before eval.distance, ASAP §4.4) | l2
        "proxy_metrics": [],  # after training, on the train split: "w2" (PFML Table 3), "avg_dtp" (RSW Table III)
        "w_power": 1,  # W₂ as printed (mean distance, 1) or a true W₂ (2): docs/readings/pfml.md#pfml-r24
        "proxy_metrics_per_epoch": False,  # also log eval.proxy_metrics at every evaluated epoch (RSW Fig. 9)
        "corruptions": [],  # [{name, severity}]: test metrics under each image corruption (RSW Table IV)
    },
    # class-disjoint validation inside the training classes (MLRC / ASAP protocol, PROTO-R3, ASAP-R33):
    # the model trains on the rest of the training classes and is evaluated on these every epoch
    "validation": {
        "split": None,  # null | fold (fold k of n_folds) | holdout (RSW's 50/50 class split) | samples (below)
        "fraction": 0.1,  # split samples: the last fraction of each training class's images validate (ASAP MNIST)
        "fold": 0,
        "n_folds": 4,
        "scheme": "linspace",  # linspace (ASAP's code) | mlrc (powerful-benchmarker's MLRCSplitManager)
        "metric": "map@r",  # monitored validation metric
        "patience": None,  # global early stopping: evaluations without improvement (ASAP: 60, ASAP-R7); null = never
        "min_delta": 1e-5,  # an evaluation improves iff value > best + min_delta
    },
    # ASAP's alternating projections (paper Alg. 1): needs an asap_* loss and a validation split;
    # one "epoch" is one evaluation interval E (steps_per_epoch), epochs caps the evaluations
    "asap": {
        "enabled": False,
        "b": 12,  # k-Center pool budget per class (pool = b if b >= P else b·P; b = 1: random)
        "lam": 2e-4,  # λ of the proximal term λ/2 ‖θ − θ*‖²
        "projection_patience": 3,  # evaluations without improvement inside a projection -> alternate
        "alternate": True,  # false: Loss-Proxy (one projection, λ = 0; ASAP-R16)
        "first_init": "kcenter_from_random",  # ASAP-R1: kcenter_from_random | random | kcenter_from_zero
        "anchor": "best",  # ASAP-R4: θ*, ρ* = best-in-projection (best) or values at the alternation (last)
        "reset_optimizer": False,  # ASAP-R5
        "lambda_first_projection": False,  # ASAP-R3: λ_eff = 0 in the first projection
        "small_budget": "times_p",  # pool size rule for b < P: times_p (b·P) | clip (P)
        "normalize": False,  # ASAP-R6: k-Center on raw outputs (false) or Lipschitz-normalised ones
        "pool_augment": True,  # ASAP-R6: pool images with the train augmentation (BN always in eval mode)
        "max_alternations": None,  # cap (null: unbounded, the paper)
        "save_val_embeddings": False,  # validation embeddings at each alternation (ASAP Fig. 7)
        # trainable: proxy-based ASAP (eq. 4.11); samples: sample-based ASAP (eq. 4.10, §5.2), the proxies are
        # the current network's embeddings of the k-Center-selected samples at every step (docs/asap.md)
        "proxies": "trainable",
    },
    "checkpoint": {"keep": 2},
    "divergence": {"check_grads": True},
    "device": "auto",
    "num_workers": 0,  # DataLoader workers; "auto": the CPUs this process may use, less one for it
    "threads": None,  # torch.set_num_threads for the run (None = leave as is); with num_workers auto: the CPU budget
    # speed only (docs/training.md#run-control): cuDNN autotuning, NHWC memory format, TF32 matmuls/convolutions,
    # and how many optimizer steps run between two reads of the loss and finiteness flags on the host
    # knn_backend: evaluation's exact k-NN search, auto | torch | faiss-cpu | faiss-gpu (docs/evaluation.md#backends)
    # checkpoint_overhead / checkpoint_floor_mb: the checkpoint policy by time (train/hooks.py CheckpointPolicy);
    # image_cache_mb: the budget of cache_images' shared cache (train/imagecache.py)
    "speed": {"cudnn_benchmark": False, "channels_last": False, "tf32": False, "sync_every": 1, "knn_backend": "auto",
              "checkpoint_overhead": 0.02, "checkpoint_floor_mb": 16, "image_cache_mb": 4096},
}

#: Hyperparameters filled in when a loss needs them and the config does not give them (the
#: losses' own defaults cover the rest; the resolved config records the value used).
LOSS_HPARAM_DEFAULTS: dict[str, dict[str, Any]] = {
    "pfml": {"proxies_per_class": 2},
    "cpml": {"proxies_per_class": 2},
    "rsw": {"alpha": 28.4, "k1": 0.93, "k2": 1.15},  # CUB phase 1 of the RSW code (RSW-R3)
}

#: (section, key) pairs that say where or how fast a run runs, not what it computes: a resumed
#: run may differ in them, and ``dmlrepro.runs`` leaves them out of the run id. Changing
#: ``threads``, ``device``, ``deterministic`` or ``speed`` can change float rounding, so
#: bit-identity after a resume holds only when they stay the same (docs/training.md#bit-exactness).
RUNTIME_KEYS = (("dataset", "root"), ("dataset", "prepare"), ("dataset", "cache_images"), ("model", "weights_cache_dir"),
                (None, "device"), (None, "num_workers"), (None, "threads"), (None, "deterministic"), (None, "speed"))


#: Keys added after finished runs existed, with the default that means "off": at that default
#: they are left out of a run's identity (``config_identity``, the one identity function) and
#: of the workflow's run configs, so adding them changed no existing run id and retrained nothing.
LATE_DEFAULTS: dict[tuple[str | None, str], Any] = {
    ("eval", "proxy_metrics_per_epoch"): False,
    ("dataset", "cache_images"): False,
    ("eval", "corruptions"): [],
    (None, "validation"): DEFAULTS["validation"],
    (None, "asap"): DEFAULTS["asap"],
    ("asap", "proxies"): "trainable",
    ("followup", "trigger"): "epochs",
    ("validation", "fraction"): 0.1,
    ("eval", "normalize"): "none",
    ("model", "standin"): None,
}


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


class ConfigError(ValueError):
    """A bad run config: the message names the key, the value and what was expected."""


def _err(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"run config: {key} = {value!r}: expected {expected}")


def _merge(base: dict, override: Mapping, prefix: str, free: set[str]) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        path = f"{prefix}{key}"
        if key not in base:
            if prefix.rstrip(".") in free:
                out[key] = copy.deepcopy(value)
                continue
            raise ConfigError(f"run config: unknown key {path!r}; expected one of {sorted(base)}")
        if isinstance(base[key], dict) and path not in free:
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise _err(path, value, "a mapping")
            out[key] = _merge(base[key], value, path + ".", free)
        else:
            out[key] = copy.deepcopy(value)
    return out


# -- small checkers ----------------------------------------------------------------------------
def _parent(cfg: dict, key: str) -> tuple[dict, str]:
    """The mapping holding dotted `key` ("optimizer.lr" -> cfg["optimizer"]) and the last part."""
    *path, last = key.split(".")
    node = cfg
    for part in path:
        node = node[part]
    return node, last


def _num(cfg: dict, key: str, *, lo: float | None = None, lo_open=False, allow_none=False, integer=False):
    node, last = _parent(cfg, key)
    v = node[last]
    if v is None and allow_none:
        return
    if isinstance(v, str) and not integer:  # PyYAML reads "1e-4" (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok_type or (not integer and not math.isfinite(v)):
        raise _err(key, v, ("an integer" if integer else "a finite number") + (" or null" if allow_none else ""))
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise _err(key, v, f"a number {'>' if lo_open else '>='} {lo}")
    node[last] = v if integer else float(v)


def _choice(cfg: dict, key: str, choices) -> None:
    node, last = _parent(cfg, key)
    v = node[last]
    if v not in choices:
        raise _err(key, v, f"one of {list(choices)}")


def _bool(cfg: dict, key: str) -> None:
    node, last = _parent(cfg, key)
    if not isinstance(node[last], bool):
        raise _err(key, node[last], "true or false")


def _group_map(cfg: dict, key: str, *, require_all: bool) -> None:
    node, last = _parent(cfg, key)
    m = node[last]
    if not isinstance(m, Mapping):
        raise _err(key, m, f"a mapping with keys among {list(GROUPS)}")
    for g, v in m.items():
        if g not in GROUPS:
            raise _err(f"{key}.{g}", v, f"a group name among {list(GROUPS)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise _err(f"{key}.{g}", v, "a finite number >= 0")
    if require_all:
        for g in GROUPS:
            if g not in m:
                raise _err(f"{key}.{g}", None, "a number (every group needs a multiplier)")


def _standin(cfg: dict) -> None:
    """model.standin: the stand-in's recipe, resolved in place (docs/miniature.md); null (ignored, not part of
    the run id) unless pretrained: standin, e.g. when a preflight swaps in random initialisation."""
    m = cfg["model"]
    if m["pretrained"] != "standin":
        m["standin"] = None
        return
    from dmlrepro.models.standin import StandinError, resolve_recipe

    if m["standin"] is not None and not isinstance(m["standin"], Mapping):
        raise _err("model.standin", m["standin"], "a mapping (the stand-in's pretraining recipe) or null")
    try:
        m["standin"] = resolve_recipe(m["standin"])
    except StandinError as e:
        raise ConfigError(f"run config: {e}") from None
    if m["standin"]["backbone"] != m["backbone"]:
        raise _err("model.standin.backbone", m["standin"]["backbone"], f"the run's backbone {m['backbone']!r}")


# -- public ----------------------------------------------------------------------------------------
def load_run_config(path: str | os.PathLike) -> dict:
    """Read a YAML run config (a mapping) from ``path``; not resolved."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run config file not found: {path}")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
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
    free = {"dataset.params", "model.backbone_kwargs", "loss.hparams", "followup.loss", "followup.lr_mult"}
    cfg = _merge(DEFAULTS, partial, "", free)
    # optimizer.lr_mult / wd_mult: keep defaults for groups not given
    for k in ("lr_mult", "wd_mult"):
        if not isinstance(cfg["optimizer"][k], Mapping):
            raise _err(f"optimizer.{k}", cfg["optimizer"][k], f"a mapping with keys among {list(GROUPS)}")

    d = cfg["dataset"]
    from dmlrepro.data import DATASETS

    _choice(cfg, "dataset.name", DATASETS)
    if not isinstance(d["root"], (str, os.PathLike)) or not str(d["root"]):
        raise _err("dataset.root", d["root"], "a folder path")
    d["root"] = str(d["root"])
    _bool(cfg, "dataset.prepare")
    if not isinstance(d["params"], Mapping):
        raise _err("dataset.params", d["params"], "a mapping")
    _num(cfg, "dataset.image_size", lo=8, integer=True)
    _num(cfg, "dataset.resize", lo=8, integer=True, allow_none=True)
    _num(cfg, "dataset.train_resize", lo=8, integer=True, allow_none=True)
    _choice(cfg, "dataset.resize_mode", ("short", "square"))
    _choice(cfg, "dataset.train_crop", ("rrc", "random"))
    for key in ("scale", "ratio"):
        v = d[key]
        if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v) and 0 < v[0] <= v[1]):
            raise _err(f"dataset.{key}", v, "a pair [low, high] with 0 < low <= high")
        d[key] = [float(x) for x in v]
    _num(cfg, "dataset.hflip", lo=0)
    if d["hflip"] > 1:
        raise _err("dataset.hflip", d["hflip"], "a probability in [0, 1]")
    _choice(cfg, "dataset.normalization", ("auto", "imagenet", "bninception", "half", "none"))
    _bool(cfg, "dataset.cache_images")
    _choice(cfg, "dataset.sampler", SAMPLERS)
    _num(cfg, "dataset.m", lo=1, integer=True)
    _num(cfg, "dataset.batch_size", lo=1, integer=True)
    _num(cfg, "dataset.eval_batch_size", lo=1, integer=True)
    _num(cfg, "dataset.length_before_new_iter", lo=1, integer=True, allow_none=True)
    if d["sampler"] == "m_per_class" and d["batch_size"] % d["m"]:
        raise _err("dataset.batch_size", d["batch_size"], f"a multiple of dataset.m = {d['m']} (sampler m_per_class)")
    if d["label_noise"] is not None:
        noise = d["label_noise"]
        if not isinstance(noise, Mapping) or set(noise) - {"rate", "seed", "mode"}:
            raise _err("dataset.label_noise", noise, "null or a mapping with rate, seed and mode")
        d["label_noise"] = noise = {"rate": 0.2, "seed": 0, "mode": "other", **noise}
        _num(cfg, "dataset.label_noise.rate", lo=0)
        if noise["rate"] > 1:
            raise _err("dataset.label_noise.rate", noise["rate"], "a fraction in [0, 1]")
        _num(cfg, "dataset.label_noise.seed", lo=0, integer=True)
        _choice(cfg, "dataset.label_noise.mode", ("other", "any"))
        if d["label_noise_file"] is not None:
            raise _err("dataset.label_noise", noise, "null when dataset.label_noise_file is given")
    if d["label_noise_file"] is not None:
        if not isinstance(d["label_noise_file"], (str, os.PathLike)):
            raise _err("dataset.label_noise_file", d["label_noise_file"], "a CSV path or null")
        d["label_noise_file"] = str(d["label_noise_file"])
    for key in ("train_split", "test_split"):
        _choice(cfg, f"dataset.{key}", ("train", "test", "query", "gallery"))
    if d["gallery_split"] is not None:
        _choice(cfg, "dataset.gallery_split", ("train", "test", "query", "gallery"))
        if d["gallery_split"] == d["test_split"]:
            raise _err("dataset.gallery_split", d["gallery_split"], "a split other than dataset.test_split, or null")

    m = cfg["model"]
    from dmlrepro.models import list_weights, resolve_backbone_name

    try:
        resolve_backbone_name(str(m["backbone"]))
    except KeyError as e:
        raise ConfigError(f"run config: model.backbone = {m['backbone']!r}: {e.args[0]}") from None
    if not (isinstance(m["pretrained"], bool) or isinstance(m["pretrained"], str)):
        raise _err("model.pretrained", m["pretrained"], "false, true or a weight name")
    if isinstance(m["pretrained"], str) and m["pretrained"] not in [*list_weights(), "standin"]:
        raise _err("model.pretrained", m["pretrained"], f"standin or a weight name among {list(list_weights())}")
    _standin(cfg)
    _num(cfg, "model.embedding_size", lo=0, integer=True, allow_none=True)
    _bool(cfg, "model.l2_normalize")
    if not isinstance(m["backbone_kwargs"], Mapping):
        raise _err("model.backbone_kwargs", m["backbone_kwargs"], "a mapping")

    lo = cfg["loss"]
    from dmlrepro.losses import LOSS_NAMES

    _choice(cfg, "loss.name", LOSS_NAMES)
    if not isinstance(lo["hparams"], Mapping):
        raise _err("loss.hparams", lo["hparams"], "a mapping of the loss's keyword arguments")
    lo["hparams"] = {**LOSS_HPARAM_DEFAULTS.get(lo["name"], {}), **lo["hparams"]}

    o = cfg["optimizer"]
    _choice(cfg, "optimizer.name", OPTIMIZERS)
    _num(cfg, "optimizer.lr", lo=0, lo_open=True)
    _num(cfg, "optimizer.weight_decay", lo=0)
    _num(cfg, "optimizer.eps", lo=0, lo_open=True, allow_none=True)
    _num(cfg, "optimizer.momentum", lo=0)
    _num(cfg, "optimizer.alpha", lo=0)
    _bool(cfg, "optimizer.nesterov")
    b = o["betas"]
    if not (isinstance(b, (list, tuple)) and len(b) == 2 and all(isinstance(x, (int, float)) and 0 <= x < 1 for x in b)):
        raise _err("optimizer.betas", b, "a pair [beta1, beta2] in [0, 1)")
    o["betas"] = [float(x) for x in b]
    o["lr_mult"] = {**DEFAULTS["optimizer"]["lr_mult"], **o["lr_mult"]}
    o["wd_mult"] = {**DEFAULTS["optimizer"]["wd_mult"], **o["wd_mult"]}
    _group_map(cfg, "optimizer.lr_mult", require_all=True)
    _group_map(cfg, "optimizer.wd_mult", require_all=True)

    _choice(cfg, "schedule.name", SCHEDULES)
    _num(cfg, "schedule.step", lo=1, integer=True)
    _num(cfg, "schedule.gamma", lo=0, lo_open=True)
    _num(cfg, "schedule.min_lr_ratio", lo=0)

    _num(cfg, "epochs", lo=1, integer=True)
    _num(cfg, "steps_per_epoch", lo=1, integer=True, allow_none=True)
    _num(cfg, "seed", lo=0, integer=True)
    if not (cfg["deterministic"] == "auto" or isinstance(cfg["deterministic"], bool)):
        raise _err("deterministic", cfg["deterministic"], "'auto', true or false")
    _num(cfg, "warmup_epochs", lo=0, integer=True)
    if cfg["warmup_epochs"] >= cfg["epochs"]:
        raise _err("warmup_epochs", cfg["warmup_epochs"], f"fewer than epochs = {cfg['epochs']}")
    for k in ("running_stats", "affine", "unfreeze_affine_after_warmup"):
        _bool(cfg, f"bn_freeze.{k}")

    gc = cfg["grad_clip"]
    _num(cfg, "grad_clip.value", lo=0, lo_open=True, allow_none=True)
    if not isinstance(gc["groups"], (list, tuple)) or not all(g in GROUPS for g in gc["groups"]):
        raise _err("grad_clip.groups", gc["groups"], f"a list of group names among {list(GROUPS)}")
    gc["groups"] = list(gc["groups"])

    f = cfg["followup"]
    _num(cfg, "followup.epochs", lo=0, integer=True)
    if f["epochs"] >= cfg["epochs"]:
        raise _err("followup.epochs", f["epochs"], f"fewer than epochs = {cfg['epochs']}"
                   + (" (with trigger plateau: a cap on phase 2, 0 = none)" if f.get("trigger") == "plateau" else ""))
    if not isinstance(f["loss"], Mapping):
        raise _err("followup.loss", f["loss"], "a mapping of loss attribute -> value")
    _num(cfg, "followup.lr", lo=0, lo_open=True, allow_none=True)
    if not isinstance(f["lr_mult"], Mapping):
        raise _err("followup.lr_mult", f["lr_mult"], f"a mapping with keys among {list(GROUPS)}")
    _group_map(cfg, "followup.lr_mult", require_all=False)

    a = cfg["amp"]
    if a["enabled"] not in ("auto", True, False):
        raise _err("amp.enabled", a["enabled"], "'auto', true or false")
    _choice(cfg, "amp.dtype", ("bfloat16", "float16"))

    e = cfg["eval"]
    _num(cfg, "eval.every", lo=0, integer=True)
    _bool(cfg, "eval.before_training")
    from dmlrepro.evaluation.clustering import nmi_options  # noqa: PLC0415
    try:
        nmi_options(e["nmi"])
    except ValueError as exc:
        raise _err("eval.nmi", e["nmi"], str(exc)) from None
    _choice(cfg, "eval.normalize", ("none", "lipschitz", "l2"))
    if e["normalize"] == "lipschitz" and e["distance"] == "cosine":  # cosine would undo v / max(1, ‖v‖)
        raise _err("eval.normalize", "lipschitz", "eval.distance: euclidean (cosine re-normalises every vector)")
    if not (isinstance(e["ks"], (list, tuple)) and e["ks"] and all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in e["ks"])):
        raise _err("eval.ks", e["ks"], "a non-empty list of integers >= 1")
    e["ks"] = sorted(set(int(k) for k in e["ks"]))
    if 1 not in e["ks"]:
        raise _err("eval.ks", e["ks"], "a list containing 1 (recall@1 is logged and used by select)")
    _choice(cfg, "eval.distance", DISTANCES)
    _choice(cfg, "eval.select", SELECT)
    if e["select"] == "best_test" and e["every"] == 0:
        raise _err("eval.every", 0, "a positive interval when eval.select is best_test")
    if not (isinstance(e["proxy_metrics"], (list, tuple)) and set(e["proxy_metrics"]) <= set(PROXY_METRICS)):
        raise _err("eval.proxy_metrics", e["proxy_metrics"], f"a list of {PROXY_METRICS}")
    if e["proxy_metrics"] and e["select"] != "last":
        raise _err("eval.proxy_metrics", e["proxy_metrics"], "an empty list with eval.select best_test (they "
                   "describe the final proxies)")
    _choice(cfg, "eval.w_power", (1, 2))
    _bool(cfg, "eval.proxy_metrics_per_epoch")
    if e["proxy_metrics_per_epoch"] and not e["proxy_metrics"]:
        raise _err("eval.proxy_metrics_per_epoch", True, "false, or a non-empty eval.proxy_metrics to log")
    e["corruptions"] = _corruptions(e["corruptions"])
    if e["corruptions"] and (e["select"] != "last" or cfg["dataset"]["gallery_split"] is not None):
        raise _err("eval.corruptions", e["corruptions"], "an empty list with eval.select best_test or a "
                   "dataset.gallery_split (they evaluate the final model on the test split alone)")

    _check_validation(cfg)
    _check_asap(cfg)
    _check_followup_trigger(cfg)

    _num(cfg, "checkpoint.keep", lo=1, integer=True)
    _bool(cfg, "divergence.check_grads")
    dev = cfg["device"]
    if not isinstance(dev, str) or not (dev in ("auto", "cpu", "cuda") or dev.startswith("cuda:")):
        raise _err("device", dev, "'auto', 'cpu', 'cuda' or 'cuda:N'")
    nw = cfg["num_workers"]
    if nw != "auto" and (isinstance(nw, bool) or not isinstance(nw, int) or nw < 0):
        raise _err("num_workers", nw, "an integer >= 0 or 'auto'")
    _num(cfg, "threads", lo=1, integer=True, allow_none=True)
    for k in ("cudnn_benchmark", "channels_last", "tf32"):
        _bool(cfg, f"speed.{k}")
    _num(cfg, "speed.sync_every", lo=1, integer=True)
    _num(cfg, "speed.checkpoint_overhead", lo=0)
    _num(cfg, "speed.checkpoint_floor_mb", lo=0)
    _num(cfg, "speed.image_cache_mb", lo=0)
    from dmlrepro.evaluation.knn import BACKENDS as KNN_BACKENDS  # noqa: PLC0415
    _choice(cfg, "speed.knn_backend", KNN_BACKENDS)

    _check_loss(cfg)
    return cfg


def _check_validation(cfg: dict) -> None:
    """validation.*: a class-disjoint split of the training classes, and what selects on it."""
    v = cfg["validation"]
    if v["split"] is not None:
        _choice(cfg, "validation.split", VALIDATION_SPLITS)
    _num(cfg, "validation.n_folds", lo=2, integer=True)
    _num(cfg, "validation.fold", lo=0, integer=True)
    if v["fold"] >= v["n_folds"]:
        raise _err("validation.fold", v["fold"], f"a fold index below validation.n_folds = {v['n_folds']}")
    _choice(cfg, "validation.scheme", FOLD_SCHEMES)
    _choice(cfg, "validation.metric", ("map@r", "r_precision", "precision@1", "recall@1"))
    _num(cfg, "validation.patience", lo=1, integer=True, allow_none=True)
    _num(cfg, "validation.min_delta", lo=0)
    _num(cfg, "validation.fraction", lo=0, lo_open=True)
    if v["fraction"] >= 1:
        raise _err("validation.fraction", v["fraction"], "a number < 1 (the share of each class's images that validate)")
    if v["split"] is None:
        if cfg["eval"]["select"] == "best_val":
            raise _err("eval.select", "best_val", "'last' or 'best_test' without a validation.split")
        if v["patience"] is not None:
            raise _err("validation.patience", v["patience"], "null without a validation.split")
        return
    if cfg["dataset"]["train_split"] != "train":
        raise _err("dataset.train_split", cfg["dataset"]["train_split"],
                   "'train' with a validation.split (the validation classes are taken from it)")


def _check_followup_trigger(cfg: dict) -> None:
    """followup.trigger: `epochs` (the last followup.epochs epochs) or `plateau` (RSW App. D: phase 2
    starts when validation patience runs out; needs a validation split and patience)."""
    _choice(cfg, "followup.trigger", FOLLOWUP_TRIGGERS)
    if cfg["followup"]["trigger"] != "plateau":
        return
    v = cfg["validation"]
    if v["split"] is None:
        raise _err("followup.trigger", "plateau", "'epochs' without a validation.split (phase 2 starts when "
                   "validation stops improving; set validation.split and validation.patience)")
    if v["patience"] is None:
        raise _err("followup.trigger", "plateau", "'epochs' without a validation.patience (the evaluations "
                   "without improvement that end each phase)")
    if cfg["asap"]["enabled"]:
        raise _err("followup.trigger", "plateau", "'epochs' with asap.enabled (ASAP's schedule owns the early stop)")


def _check_asap(cfg: dict) -> None:
    """asap.*: the alternation schedule and k-Center selection (ASAP Alg. 1–2; docs/readings/asap.md)."""
    from dmlrepro.asap.kcenter import FIRST_INIT, SMALL_BUDGET
    from dmlrepro.asap.schedule import ANCHORS

    a = cfg["asap"]
    for key in ("enabled", "alternate", "reset_optimizer", "lambda_first_projection", "normalize", "pool_augment",
                "save_val_embeddings"):
        _bool(cfg, f"asap.{key}")
    _num(cfg, "asap.b", lo=1, integer=True)
    _num(cfg, "asap.lam", lo=0)
    _num(cfg, "asap.projection_patience", lo=1, integer=True)
    _num(cfg, "asap.max_alternations", lo=0, integer=True, allow_none=True)
    _choice(cfg, "asap.first_init", FIRST_INIT)
    _choice(cfg, "asap.anchor", ANCHORS)
    _choice(cfg, "asap.small_budget", SMALL_BUDGET)
    _choice(cfg, "asap.proxies", ASAP_PROXIES)
    if not a["enabled"]:
        return
    if not str(cfg["loss"]["name"]).startswith("asap_"):
        raise _err("asap.enabled", True, f"false for loss {cfg['loss']['name']!r} (ASAP needs an asap_* proxy loss)")
    if cfg["validation"]["split"] is None:
        raise _err("asap.enabled", True, "false without a validation.split (alternations follow validation "
                   "MAP@R; set validation.split: fold)")
    if cfg["eval"]["select"] == "best_test":
        raise _err("eval.select", "best_test", "'best_val' or 'last' with asap.enabled")


def _corruptions(value: Any) -> list[dict]:
    """eval.corruptions: a list of {name, severity} (RSW Table IV, dmlrepro.data.corruptions)."""
    from dmlrepro.data.corruptions import CORRUPTIONS

    key = "eval.corruptions"
    if not isinstance(value, (list, tuple)):
        raise _err(key, value, "a list of {name, severity} mappings")
    out, seen = [], set()
    for item in value:
        if not isinstance(item, Mapping) or set(item) - {"name", "severity"} or "name" not in item:
            raise _err(key, item, "a mapping with keys name (and severity)")
        name, severity = item["name"], item.get("severity")
        if name not in CORRUPTIONS:
            raise _err(f"{key}[].name", name, f"one of {sorted(CORRUPTIONS)}")
        if severity is not None and (isinstance(severity, bool) or severity not in (1, 2, 3, 4, 5)):
            raise _err(f"{key}[].severity", severity, "null (imgaug's default range) or an integer 1..5")
        if (name, severity) in seen:
            raise _err(key, item, "each {name, severity} at most once")
        seen.add((name, severity))
        out.append({"name": name, "severity": severity})
    return out


def corruption_suffix(item: Mapping[str, Any]) -> str:
    """The metric suffix of one eval.corruptions entry: `gaussian_3`, or `gaussian` (default range)."""
    return item["name"] if item.get("severity") is None else f"{item['name']}_{item['severity']}"


def _check_loss(cfg: dict) -> None:
    """Build the loss once on a toy size: unknown hyperparameters and followup attributes fail here."""
    from dmlrepro.losses import build_loss

    lo, f = cfg["loss"], cfg["followup"]
    emb = cfg["model"]["embedding_size"] or 8
    try:
        loss = build_loss(lo["name"], 4, emb, **dict(lo["hparams"]))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"run config: loss.hparams = {dict(lo['hparams'])!r} for loss {lo['name']!r}: {e}") from None
    for attr, value in f["loss"].items():
        if attr.startswith("_") or not hasattr(loss, attr) or callable(getattr(loss, attr)) \
                or isinstance(getattr(loss, attr), __import__("torch").Tensor):
            raise _err(f"followup.loss.{attr}", value, f"a plain attribute of loss {lo['name']!r}")
    if f["loss"] and f["epochs"] == 0 and f["trigger"] == "epochs":
        raise _err("followup.epochs", 0, "a positive number of epochs when followup.loss is set")


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
