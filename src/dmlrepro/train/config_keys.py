"""Every run-config key in one table: its dotted name, default, check and meaning.

``DEFAULTS`` (the nested default config), the keys' own checks, ``LATE_DEFAULTS``, ``RUNTIME_KEYS``
and the key tables of docs/training.md are all derived from ``KEYS``; checks that involve several
keys are ``dmlrepro.train.config``'s. ``python -m dmlrepro.train.config_keys --markdown`` prints the
docs' tables, ``--write docs/training.md`` puts them between the docs' marker comments.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .config_checks import (
    GROUPS,
    AnyMapping,
    Choice,
    Custom,
    Flag,
    LossName,
    Number,
    Record,
    adam_betas,
    backbone_name,
    corruption_list,
    crop_range,
    device_name,
    group_list,
    group_multipliers,
    nmi_setting,
    path_string,
    pretrained_weights,
    recall_ks,
    subset_of,
    worker_count,
)

OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")
SCHEDULES = ("none", "step", "cosine")
SAMPLERS = ("random", "m_per_class")
SELECT = ("last", "best_test", "best_val")
VALIDATION_SPLITS = ("fold", "holdout", "samples")
FOLD_SCHEMES = ("linspace", "mlrc")
DISTANCES = ("cosine", "euclidean")
PROXY_METRICS = ("w2", "avg_dtp", "trap")
ASAP_PROXIES = ("trainable", "samples")
FOLLOWUP_TRIGGERS = ("epochs", "plateau")
SPLITS = ("train", "test", "query", "gallery")


def _unchecked(text: str) -> Custom:
    """A key another module checks when it uses it (``text`` says which)."""
    return Custom(lambda key, value: value, text)


@dataclass(frozen=True)
class Key:
    """One run-config key. ``late``: added after finished runs existed, so at its default it is left
    out of a run's identity; ``runtime``: says where or how fast a run runs, not what it computes."""

    name: str
    default: Any
    check: Any
    doc: str
    late: bool = False
    runtime: bool = False


@dataclass(frozen=True)
class Section:
    """A whole section that is late or runtime as one (its keys are ``Key``s of their own)."""

    name: str
    late: bool = False
    runtime: bool = False


#: dataset.label_noise's fields (PFML Table 2's seeded corruption of the training labels)
LABEL_NOISE = (
    Key(
        "rate",
        0.2,
        Number(low=0, high=1, high_expected="a fraction in [0, 1]"),
        "share of the training labels replaced",
    ),
    Key("seed", 0, Number(integer=True, low=0), "seed of the corruption (the noisy labels depend on it alone)"),
    Key(
        "mode",
        "other",
        Choice(("other", "any")),
        "a replaced label is drawn from the other training classes (`other`) or from all of them (`any`)",
    ),
)

KEYS: tuple[Key, ...] = (
    # -- dataset
    Key(
        "dataset.name",
        "synthetic",
        Choice("dmlrepro.data:DATASETS"),
        "`cub200`, `cars196`, `sop`, `inshop`, `synthetic`, `digits`",
    ),
    Key("dataset.root", "data", path_string("a folder path"), "folder holding `<name>/manifest.csv`", runtime=True),
    Key(
        "dataset.prepare",
        True,
        Flag(),
        "embedded datasets (`synthetic`, `digits`) are generated on first use (reused if prepared with the same "
        "`params`); benchmarks must be prepared beforehand (`dmlrepro prepare NAME --root ROOT`)",
        runtime=True,
    ),
    Key(
        "dataset.params",
        {},
        AnyMapping(),
        "parameters of the embedded generator (`synthetic`: `num_classes`, `images_per_class`, `size`, `seed`, "
        "`modes`, `family_size`; `digits`: `size`)",
    ),
    Key("dataset.train_split", "train", Choice(SPLITS), "manifest split used for training"),
    Key("dataset.test_split", "test", Choice(SPLITS), "manifest split of the test embeddings"),
    Key(
        "dataset.gallery_split",
        None,
        Choice(SPLITS, or_null=True),
        "with a split name (In-Shop: `gallery`), the test split's items are queries retrieved from this split "
        "(not `test_split`)",
    ),
    Key(
        "dataset.image_size",
        32,
        Number(integer=True, low=8),
        "crop size fed to the network (papers: 224; MLRC/ASAP 227)",
    ),
    Key(
        "dataset.resize",
        None,
        Number(integer=True, low=8, or_null=True),
        "eval resize before the centre crop (`null`: the data layer's 256/224 rule); also the train resize for "
        "`train_crop: random`",
    ),
    Key("dataset.resize_mode", "short", Choice(("short", "square")), "`short` (shorter side) or `square`"),
    Key(
        "dataset.train_crop",
        "rrc",
        Choice(("rrc", "random")),
        "`rrc` = RandomResizedCrop(`image_size`, `scale`, `ratio`); `random` = Resize(`train_resize` or `resize`) "
        "→ RandomCrop",
    ),
    Key(
        "dataset.train_resize",
        None,
        Number(integer=True, low=8, or_null=True),
        "resize before the train crop (MLRC: 256)",
    ),
    Key("dataset.scale", [0.08, 1.0], Custom(crop_range, "pair 0 < low ≤ high"), "RandomResizedCrop's scale range"),
    Key(
        "dataset.ratio",
        [0.75, 1.3333333333333333],
        Custom(crop_range, "pair 0 < low ≤ high"),
        "RandomResizedCrop's aspect-ratio range (3/4, 4/3)",
    ),
    Key(
        "dataset.hflip",
        0.5,
        Number(low=0, high=1, high_expected="a probability in [0, 1]"),
        "horizontal flip probability",
    ),
    Key(
        "dataset.normalization",
        "auto",
        Choice(("auto", "imagenet", "bninception", "half", "none")),
        "`auto` = from the backbone's input convention (`imagenet`, `bninception` = BGR 0–255, `half` = mean = "
        "std = 0.5 for AugReg ViTs), or one of those names, or `none`",
    ),
    Key(
        "dataset.sampler",
        "random",
        Choice(SAMPLERS),
        "`random` (shuffled, drop_last) or `m_per_class` (`batch_size/m` classes × `m` images)",
    ),
    Key(
        "dataset.m",
        4,
        Number(integer=True, low=1),
        "images per class for `m_per_class` (`batch_size` must be a multiple)",
    ),
    Key(
        "dataset.length_before_new_iter",
        None,
        Number(integer=True, low=1, or_null=True),
        "`m_per_class` epoch length in images (`null` = dataset size; MLRC's 100 iterations = `100*batch_size`)",
    ),
    Key("dataset.batch_size", 64, Number(integer=True, low=1), "training batch"),
    Key("dataset.eval_batch_size", 256, Number(integer=True, low=1), "batch for computing embeddings"),
    Key(
        "dataset.label_noise_file",
        None,
        path_string("a CSV path or null", or_null=True, may_be_empty=True),
        "a noisy-label CSV from `dmlrepro.data.write_noisy_labels` (PFML Table 2)",
    ),
    Key(
        "dataset.label_noise",
        None,
        Record(LABEL_NOISE, "null or a mapping with rate, seed and mode"),
        "`{rate, seed, mode}`: PFML Table 2's seeded corruption of the training labels, written once beside the "
        "manifest (`<root>/<name>/label_noise/`); `null` when `label_noise_file` is given",
    ),
    Key(
        "dataset.cache_images",
        False,
        Flag(),
        "keep each decoded image in memory after its first read: one uint8 buffer in shared memory for the whole "
        "run, filled by whichever loader worker reads an image first and read by all (`train/imagecache.py`), when "
        "the images fit `speed.image_cache_mb`; else per process, as before. Speed only, for small datasets (the "
        "embedded default sets it through the workflow's top-level `cache_images`)",
        late=True,
        runtime=True,
    ),
    # -- model (docs/models.md; keys with null are left out, so the preset's or the backbone's default applies)
    Key(
        "model.backbone",
        "tiny_cnn",
        Custom(backbone_name, "a registry name or alias"),
        "`resnet50`, `bn_inception`, `vit_small_patch16_224`, `dino_vits16`, `resnet18`, `resnet10t`, "
        "`mobilenetv3_small_100`, `tiny_cnn`, or an alias",
    ),
    Key(
        "model.pretrained",
        False,
        Custom(pretrained_weights, "`false`, `true`, a weight name, `digit_trunk`"),
        "`true` = the backbone's default weights, or a weight name; read from the weight cache only; `digit_trunk` = "
        "the multi-digit datasets' digit-pretrained trunk (docs/models.md#the-digit-pretrained-trunk)",
    ),
    Key(
        "model.digit_trunk",
        None,
        _unchecked("`null` or a mapping (the digit trunk's recipe)"),
        "with `pretrained: digit_trunk`: the trunk's pretraining recipe (`dmlrepro.digit_trunk_recipe.RECIPE_DEFAULTS` "
        "with these keys over it; resolved in full, part of the run id; ignored, null, with any other `pretrained`); "
        "the file is `<weights_cache_dir>/digits-<recipe hash>.pt`",
        late=True,
    ),
    Key(
        "model.preset",
        None,
        _unchecked("checked by `build_model`"),
        "`proxy_anchor`, `pfml`, `rsw`, `asap`, `mlrc` (pooling/head settings)",
    ),
    Key("model.pool", None, _unchecked("checked by `build_model`"), "pooling (`null`: the preset's or the backbone's)"),
    Key(
        "model.head",
        None,
        _unchecked("checked by `build_model`"),
        "embedding head (`null`: the preset's or `linear`; `layernorm_linear` = RSW's LayerNorm head)",
    ),
    Key("model.embedding_size", 64, Number(integer=True, low=0, or_null=True), "output width (`0`/`null`: no head)"),
    Key("model.l2_normalize", True, Flag(), "L2-normalise the output (RSW: `false`)"),
    Key("model.head_init", None, _unchecked("checked by `build_model`"), "head initialisation (docs/models.md)"),
    Key("model.head_bias", None, _unchecked("checked by `build_model`"), "head bias (docs/models.md)"),
    Key(
        "model.mlp_hidden", None, _unchecked("checked by `build_model`"), "hidden width of an MLP head (docs/models.md)"
    ),
    Key("model.weights_cache_dir", None, _unchecked("path, or `null`"), "weight cache location", runtime=True),
    Key("model.weights_sha256", None, _unchecked("digest, or `null`"), "weight digest override"),
    Key("model.backbone_kwargs", {}, AnyMapping(), "passed to the trunk builder (e.g. `tiny_cnn` `widths`, `strides`)"),
    # -- loss
    Key(
        "loss.name",
        "pfml",
        LossName(),
        "the loss (`dmlrepro losses` lists them), or a loss of your own declared with `register_loss`: "
        "`package.module:ClassName`, importable where the runs run ([Your own loss](tasks/own-loss.md))",
    ),
    Key(
        "loss.hparams",
        {},
        AnyMapping("a mapping of the loss's keyword arguments"),
        "keyword arguments of the loss. Filled in when missing: `pfml`/`cpml` `proxies_per_class: 2`; `rsw` "
        "`alpha: 28.4, k1: 0.93, k2: 1.15` (RSW code, CUB phase 1). The number of classes is the number of "
        "distinct training labels (mapped to 0..C−1), the embedding size the model's",
    ),
    # -- optimizer, schedule
    Key("optimizer.name", "adam", Choice(OPTIMIZERS), "the optimizer"),
    Key("optimizer.lr", 1e-4, Number(low=0, low_open=True), "base lr"),
    Key("optimizer.weight_decay", 0.0, Number(low=0), "coupled L2 for adam/rmsprop/sgd, decoupled for adamw"),
    Key("optimizer.eps", None, Number(low=0, low_open=True, or_null=True), "`null` = torch's default; RSW: `1.0`"),
    Key("optimizer.betas", [0.9, 0.999], Custom(adam_betas, "pair in [0, 1)"), "adam/adamw"),
    Key("optimizer.momentum", 0.0, Number(low=0), "sgd, rmsprop (MLRC: 0.9)"),
    Key("optimizer.alpha", 0.99, Number(low=0), "rmsprop smoothing constant"),
    Key("optimizer.nesterov", False, Flag(), "sgd"),
    Key(
        "optimizer.lr_mult",
        {group: 1.0 for group in GROUPS},
        Custom(group_multipliers, "number ≥ 0 per group"),
        "lr multiplier per parameter group: `backbone` = the trunk, `head` = pooling + embedding head, `loss` = the "
        "loss's parameters (proxies). PFML / Proxy-Anchor: `loss: 100`. A loss may add linked groups `loss.<name>` "
        "whose lr is a fixed multiple of a group's (HIST's HGNN: `hgnn_lr_factor` × the backbone's; docs/losses.md)",
    ),
    Key(
        "optimizer.wd_mult",
        {group: 1.0 for group in GROUPS},
        Custom(group_multipliers, "number ≥ 0 per group"),
        "weight-decay multiplier per group",
    ),
    Key(
        "schedule.name",
        "none",
        Choice(SCHEDULES),
        "`step` (lr × `gamma`^⌊(e−1)/`step`⌋, torch StepLR stepped per epoch), `cosine` (from lr to "
        "`min_lr_ratio`·lr over `epochs`, CosineAnnealingLR per epoch)",
    ),
    Key("schedule.step", 10, Number(integer=True, low=1), "epochs per lr step"),
    Key("schedule.gamma", 0.5, Number(low=0, low_open=True), "lr factor per step"),
    Key("schedule.min_lr_ratio", 0.0, Number(low=0), "cosine: the last epoch's lr as a share of lr"),
    # -- warm-up, BN freezing, clipping, followup
    Key(
        "warmup_epochs",
        0,
        Number(integer=True, low=0),
        "the first N epochs (fewer than `epochs`) train only head and loss parameters (backbone "
        "`requires_grad=False`; Proxy-Anchor `--warm`). BN running statistics still update during warm-up unless "
        "`bn_freeze.running_stats`",
    ),
    Key(
        "bn_freeze.running_stats",
        False,
        Flag(),
        "BatchNorm layers stay in eval mode (statistics never updated), also after `model.train()`",
    ),
    Key("bn_freeze.affine", False, Flag(), "BN weight/bias not trained"),
    Key(
        "bn_freeze.unfreeze_affine_after_warmup",
        False,
        Flag(),
        "Proxy-Anchor's code: BN affine trainable again after the warm-up epochs (statistics stay frozen)",
    ),
    Key(
        "grad_clip.value",
        None,
        Number(low=0, low_open=True, or_null=True),
        "clip gradients by value (Proxy-Anchor: 10)",
    ),
    Key(
        "grad_clip.groups",
        list(GROUPS),
        Custom(group_list, "list of groups"),
        "which groups are clipped (RSW: `[backbone, head]`)",
    ),
    Key(
        "followup.epochs",
        0,
        Number(integer=True, low=0),
        "RSW's second phase: the last E_f epochs, fewer than `epochs` (with `trigger: plateau`: a cap on phase 2's "
        "epochs, `0` = no cap but `epochs`)",
    ),
    Key(
        "followup.loss",
        {},
        AnyMapping("a mapping of loss attribute -> value"),
        "loss attributes set during phase 2 (e.g. RSW `alpha`, `k1`, `k2`, `scale`); phase 1 values come back when "
        "a run resumes in phase 1",
    ),
    Key("followup.lr", None, Number(low=0, low_open=True, or_null=True), "base lr of phase 2 (`null` = unchanged)"),
    Key(
        "followup.lr_mult",
        {},
        Custom(group_multipliers, "number ≥ 0 per group given"),
        "multipliers of phase 2 replacing `optimizer.lr_mult` for the groups given (RSW CUB: lr 0.001, proxy lr "
        "0.0005 → `lr: 0.001, lr_mult: {loss: 0.5}`). The optimizer state is kept, as in the RSW code",
    ),
    Key(
        "followup.trigger",
        "epochs",
        Choice(FOLLOWUP_TRIGGERS),
        "when phase 2 starts: `epochs` = the last `followup.epochs` epochs; `plateau` = when validation patience "
        "first runs out (RSW App. D, below). Needs `validation.split` and `validation.patience`, not with "
        "`asap.enabled`",
        late=True,
    ),
    # -- run control
    Key(
        "amp.enabled",
        False,
        Flag(auto=True),
        "mixed precision of the training steps: `false` = float32 on every device "
        "([PROTO-R9](readings/protocols.md#proto-r9)); `auto` = on for CUDA, off on CPU; `true` = on for either "
        "device (the CPU autocasts too); evaluation is always float32 "
        "([Mixed precision](#mixed-precision-cuda-and-cpu))",
    ),
    Key(
        "amp.dtype",
        "bfloat16",
        Choice(("bfloat16", "float16")),
        "`float16` runs with a GradScaler, saved in the checkpoint",
    ),
    Key("epochs", 3, Number(integer=True, low=1), "number of epochs"),
    Key(
        "steps_per_epoch",
        None,
        Number(integer=True, low=1, or_null=True),
        "cap on optimizer steps per epoch (`null` = the sampler's epoch)",
    ),
    Key(
        "seed",
        0,
        Number(integer=True, low=0),
        "seeds python, numpy, torch (model and proxy init), the samplers and the augmentation",
    ),
    Key(
        "deterministic",
        "auto",
        Flag(auto=True),
        "`true`: `torch.use_deterministic_algorithms(True, warn_only=True)`, cuDNN deterministic, "
        "`CUBLAS_WORKSPACE_CONFIG=:4096:8`, restored after the run; `auto` = `true` on the CPU, `false` on CUDA "
        "([Bit-exactness](#bit-exactness))",
        runtime=True,
    ),
    Key(
        "eval.every",
        1,
        Number(integer=True, low=0),
        "test-set evaluation every N epochs for the log (0 = only at the end; the last epoch is always evaluated)",
    ),
    Key("eval.before_training", True, Flag(), "evaluate the untrained network (log row 0, `untrained_metrics`)"),
    Key("eval.ks", [1, 2, 4, 8], Custom(recall_ks, "list of integers ≥ 1 with 1"), "Recall@K"),
    Key("eval.distance", "cosine", Choice(DISTANCES), "RSW: unnormalised Euclidean"),
    Key(
        "eval.select",
        "last",
        Choice(SELECT),
        "reported model: `last` epoch, `best_test` (highest test R@1 among the evaluated epochs, first on ties; "
        "Proxy-Anchor's code; needs `eval.every` > 0), or `best_val` (the best validation-metric model, "
        "`checkpoints/best_val_model.pt`; needs `validation.split`)",
    ),
    Key(
        "eval.nmi",
        False,
        Custom(nmi_setting, "`true`, `false` or a mapping"),
        "also k-means NMI (seeded by `seed`): `true` = faiss k-means (one run), arithmetic mean "
        "([PROTO-R4](readings/protocols.md#proto-r4)), or a mapping `{average: arithmetic \\| geometric, kmeans: "
        "faiss \\| sklearn, n_init: 10}`; RSW: `{average: geometric, kmeans: sklearn}`, its code's computation "
        "([RSW-R8](readings/rsw.md#rsw-r8))",
    ),
    Key(
        "eval.normalize",
        "none",
        Choice(("none", "lipschitz", "l2")),
        "`lipschitz`: every test and validation metric on v / max(1, ‖v‖) (needs `eval.distance: euclidean`; "
        "ASAP, [ASAP-R32](readings/asap.md#asap-r32)); `l2`: v / ‖v‖",
        late=True,
    ),
    Key(
        "eval.proxy_metrics",
        [],
        subset_of(PROXY_METRICS),
        "after training: `w2` (PFML Table 3; with the loss's δ, `proxy_delta`, its gate's bound), `avg_dtp` "
        "(RSW Table III) and/or `trap` (the proxy-trap diagnostics `proxy_spread`, `zero_grad_share`, `step_ratio`: "
        "[PFML-R4](readings/pfml.md#pfml-r4)) of the final proxies on the training split (needs `eval.select: last`)",
    ),
    Key(
        "eval.w_power",
        1,
        Choice((1, 2)),
        "W₂ as printed (mean distance) or `2` (a true W₂), [PFML-R24](readings/pfml.md#pfml-r24)",
    ),
    Key(
        "eval.proxy_metrics_per_epoch",
        False,
        Flag(),
        "also compute `eval.proxy_metrics` (not empty) at every evaluated epoch (and epoch 0 with "
        "`before_training`) and log them as `train_log.csv` columns (`avg_dtp`, `w2`): RSW Fig. 9. A diverged "
        "run's metrics.json then carries the proxy metrics of its last finite evaluation",
        late=True,
    ),
    Key(
        "eval.corruptions",
        [],
        Custom(corruption_list, "list of `{name, severity}`"),
        "`[{name, severity}]` (`dmlrepro.data.corruptions`: `gaussian`, `uniform`, `salt_and_pepper`, `dropout`, "
        "`cutout`, `shear`, `jigsaw`, `hue_saturation`, `defocus_blur`; severity 1–5 or null = imgaug's default "
        "range): after training, the final model's test retrieval metrics (no NMI: Table IV prints R@1, and the "
        "k-means would cost more than the rest) with every test image corrupted, in metrics.json "
        "`corruption_metrics` as `<metric>@<name>_<severity>` (e.g. `recall@1@gaussian_3`); RSW Table IV. "
        "Per-image draws use a fixed seed, so every run sees the same corrupted images. Needs `select: last` and no "
        "gallery split",
        late=True,
    ),
    # -- validation split and ASAP (MLRC / ASAP protocol, PROTO-R3, ASAP-R33)
    Key(
        "validation.split",
        None,
        Choice(VALIDATION_SPLITS, or_null=True),
        "`fold`: fold `validation.fold` of `n_folds` class-disjoint folds of the training classes; `holdout`: "
        "RSW's 50/50 class split; `samples`: not class-disjoint, the last `validation.fraction` of each training "
        "class's images (manifest order) validate and every class trains (ASAP's MNIST proof of concept, \"10 % of "
        'train as validation", [ASAP-R28](readings/asap.md#asap-r28)); `null`: no validation. Needs '
        "`dataset.train_split: train`",
    ),
    Key(
        "validation.fraction",
        0.1,
        Number(
            low=0,
            low_open=True,
            high=1,
            high_open=True,
            high_expected="a number < 1 (the share of each class's images that validate)",
        ),
        "with `split: samples`: the share of each class's training images that validate (rounded per class; at "
        "least 1, and at least 1 left to train)",
        late=True,
    ),
    Key(
        "validation.fold",
        0,
        Number(integer=True, low=0),
        "which fold, below `n_folds` (the MLRC experiments sweep `validation.fold: [0, 1, 2, 3]`)",
    ),
    Key(
        "validation.n_folds",
        4,
        Number(integer=True, low=2),
        "number of folds (ASAP's ablations use `n_folds: 3, fold: 0` = train on 2/3, validate on 1/3)",
    ),
    Key(
        "validation.scheme",
        "linspace",
        Choice(FOLD_SCHEMES),
        "`linspace` (ASAP's code: contiguous class partitions, fold k validates on partition k) or `mlrc` "
        "(powerful-benchmarker's `MLRCSplitManager`), `dmlrepro.data.splits`",
    ),
    Key(
        "validation.metric",
        "map@r",
        Choice(("map@r", "r_precision", "precision@1", "recall@1")),
        "the monitored validation metric",
    ),
    Key(
        "validation.patience",
        None,
        Number(integer=True, low=1, or_null=True),
        "stop after this many evaluations without improvement (ASAP: 60, [ASAP-R7](readings/asap.md#asap-r7)); "
        "`null` = never (and `null` without a split). With `followup.trigger: plateau` the first time starts phase "
        "2 instead (see above)",
    ),
    Key("validation.min_delta", 1e-5, Number(low=0), "an evaluation improves iff value > best + min_delta"),
    Key(
        "asap.enabled", False, Flag(), "ASAP's alternating projections (needs an `asap_*` loss and a validation split)"
    ),
    Key(
        "asap.b",
        12,
        Number(integer=True, low=1),
        "k-Center pool budget per class: pool b if b ≥ P, else b·P (`small_budget: times_p`) or P (`clip`); b = 1 "
        "is random sampling",
    ),
    Key(
        "asap.lam",
        2e-4,
        Number(low=0),
        "λ of the proximal term λ/2‖θ − θ*‖² on the network's weights (not the proxies)",
    ),
    Key(
        "asap.projection_patience",
        3,
        Number(integer=True, low=1),
        "evaluations without improvement inside a projection before an alternation",
    ),
    Key(
        "asap.alternate",
        True,
        Flag(),
        "`false`: Loss-Proxy (one projection, set `lam: 0`; [ASAP-R16](readings/asap.md#asap-r16))",
    ),
    Key(
        "asap.first_init",
        "kcenter_from_random",
        Choice("dmlrepro.config_names:FIRST_INIT"),
        "[ASAP-R1](readings/asap.md#asap-r1): first proxies by k-Center seeded with P random samples per class "
        "(`kcenter_from_random`); `random`; `kcenter_from_zero` (later code)",
    ),
    Key(
        "asap.anchor",
        "best",
        Choice("dmlrepro.config_names:ANCHORS"),
        "[ASAP-R4](readings/asap.md#asap-r4): θ*, ρ* at an alternation = the best-in-projection values (`best`) or "
        "the values at the alternation (`last`)",
    ),
    Key(
        "asap.reset_optimizer",
        False,
        Flag(),
        "[ASAP-R5](readings/asap.md#asap-r5): clear Adam's moments at each alternation",
    ),
    Key(
        "asap.lambda_first_projection",
        False,
        Flag(),
        "[ASAP-R3](readings/asap.md#asap-r3): λ_eff = 0 in the first projection",
    ),
    Key(
        "asap.small_budget",
        "times_p",
        Choice("dmlrepro.config_names:SMALL_BUDGET"),
        "pool size rule for b < P: `times_p` (b·P) or `clip` (P)",
    ),
    Key(
        "asap.normalize",
        False,
        Flag(),
        "[ASAP-R6](readings/asap.md#asap-r6): k-Center on raw outputs, or Lipschitz-normalised ones",
    ),
    Key(
        "asap.pool_augment",
        True,
        Flag(),
        "[ASAP-R6](readings/asap.md#asap-r6): pool images with the train augmentation (BN always in inference mode)",
    ),
    Key(
        "asap.max_alternations",
        None,
        Number(integer=True, low=0, or_null=True),
        "cap on alternations (`null`: unbounded, the paper)",
    ),
    Key(
        "asap.save_val_embeddings",
        False,
        Flag(),
        "write `projections/projection-K_val.npz`, the validation embeddings at each projection's solution (ASAP "
        "Fig. 7)",
    ),
    Key(
        "asap.proxies",
        "trainable",
        Choice(ASAP_PROXIES),
        "`trainable`: proxy-based ASAP (eq. 4.11); `samples`: sample-based ASAP (eq. 4.10, §5.2), the proxies are "
        "the current network's embeddings of the k-Center-selected samples at every step ([asap.md](asap.md))",
        late=True,
    ),
    # -- checkpoints, divergence, where and how fast
    Key("checkpoint.keep", 2, Number(integer=True, low=1), "checkpoints kept"),
    Key(
        "divergence.check_grads",
        True,
        Flag(),
        "also stop on non-finite gradients (not with float16 AMP, where the GradScaler skips such steps)",
    ),
    Key(
        "device",
        "auto",
        Custom(device_name, "`auto`, `cpu`, `cuda`, `cuda:N`"),
        "where the run trains and evaluates: `auto` = CUDA where a GPU is usable, else the CPU unless the job asked "
        "for a GPU (`DMLREPRO_GPUS`, a GPU slot), decided once when the run starts (config.yaml records the device "
        "used); a run that asked for a GPU and has none stops at once with one line saying why "
        "([environment.md](environment.md#gpu-driver))",
        runtime=True,
    ),
    Key(
        "num_workers",
        0,
        Custom(worker_count, "integer ≥ 0, or `auto`"),
        "DataLoader workers (does not change the numbers); `auto`: the CPUs this process may use less one "
        "([CPUs and workers](#cpus-and-workers))",
        runtime=True,
    ),
    Key(
        "threads",
        None,
        Number(integer=True, low=1, or_null=True),
        "`torch.set_num_threads` for the run (restored afterwards; `null` = leave as is); with `num_workers: auto` "
        "the run's CPU budget (the workflow passes the job's CPUs)",
        runtime=True,
    ),
    Key("speed.cudnn_benchmark", False, Flag(), "cuDNN autotuning (ignored while `deterministic` is on)"),
    Key("speed.channels_last", False, Flag(), "model and batches in NHWC memory format"),
    Key(
        "speed.tf32",
        False,
        Flag(),
        "TF32 in CUDA matmuls and cuDNN convolutions during training, on (`true`) or off (`false`, cuDNN's "
        "included, whose torch default is on); every k-NN search runs with TF32 off either way "
        "([evaluation.md](evaluation.md#precision))",
    ),
    Key(
        "speed.sync_every",
        1,
        Number(integer=True, low=1),
        "optimizer steps between two host reads of the loss sum and the non-finite flags ([Divergence](#divergence))",
    ),
    Key(
        "speed.knn_backend",
        "auto",
        Choice("dmlrepro.config_names:KNN_BACKENDS"),
        "evaluation's exact k-NN search: `auto`, `torch`, `faiss-cpu`, `faiss-gpu` (docs/evaluation.md#backends)",
    ),
    Key(
        "speed.checkpoint_overhead",
        0.02,
        Number(low=0),
        "the share of wall time end-of-epoch checkpoints may take ([checkpoint policy](#checkpoint-policy)); `1` "
        "writes one every epoch, `0` only at the end and on a signal",
    ),
    Key(
        "speed.checkpoint_floor_mb",
        16,
        Number(low=0),
        "after a checkpoint smaller than this (MiB) the next epoch's end is checkpointed whatever "
        "`checkpoint_overhead` says (small models; a size, unlike a time, does not depend on the machine's load)",
    ),
    Key(
        "speed.image_cache_mb",
        4096,
        Number(low=0),
        "the largest decoded size (MiB, 3·H·W bytes per image, read from the image headers) the shared image cache "
        "of `cache_images` takes",
    ),
)

#: Sections that are late or runtime as a whole (ASAP's and the validation split's keys came after
#: finished runs existed; speed options never change what a run computes).
SECTIONS: tuple[Section, ...] = (
    Section("validation", late=True),
    Section("asap", late=True),
    Section("speed", runtime=True),
)


def _nested_defaults() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in KEYS:
        *sections, last = key.name.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[last] = copy.deepcopy(key.default)
    return out


def _split(name: str) -> tuple[str | None, str]:
    """ "eval.ks" -> ("eval", "ks"); "epochs" -> (None, "epochs")."""
    section, _, last = name.rpartition(".")
    return section or None, last


#: The run config with every default (the resolved config of ``{}`` fills in the loss's hparams too).
DEFAULTS: dict[str, Any] = _nested_defaults()

#: Keys added after finished runs existed, with the default that means "off": at that default
#: they are left out of a run's identity (``config.config_identity``) and of the workflow's run
#: configs, so adding them changed no existing run id and retrained nothing.
LATE_DEFAULTS: dict[tuple[str | None, str], Any] = {
    **{_split(key.name): key.default for key in KEYS if key.late},
    **{(None, section.name): DEFAULTS[section.name] for section in SECTIONS if section.late},
}

#: Keys removed from the run config, with the value a config.yaml written while they existed holds
#: (model.standin: the generated stand-in's recipe, null unless ``pretrained: standin``): at that value a
#: stored config reads as one without them, so its run resumes and evaluates as before.
RETIRED_KEYS: dict[tuple[str | None, str], Any] = {("model", "standin"): None}

#: (section, key) pairs that say where or how fast a run runs, not what it computes: a resumed
#: run may differ in them, and ``dmlrepro.runs`` leaves them out of the run id. Changing
#: ``threads``, ``device``, ``deterministic`` or ``speed`` can change float rounding, so
#: bit-identity after a resume holds only when they stay the same (docs/training.md#bit-exactness).
RUNTIME_KEYS: tuple[tuple[str | None, str], ...] = (
    *(_split(key.name) for key in KEYS if key.runtime),
    *((None, section.name) for section in SECTIONS if section.runtime),
)

#: Keys whose value is a mapping of free keys (a loss's keyword arguments, a builder's): the merge
#: takes them as given, their own checks (or the code that uses them) look inside.
FREE_MAPPINGS: frozenset[str] = frozenset(key.name for key in KEYS if key.default == {})

#: Keys by dotted name.
KEYS_BY_NAME: dict[str, Key] = {key.name: key for key in KEYS}


# -- docs/training.md's key tables -----------------------------------------------------------------
#: docs table -> the first part of the keys it lists (the rest go to "run")
DOC_TABLES = {
    "dataset": ("dataset",),
    "model": ("model",),
    "loss": ("loss",),
    "optimizer": ("optimizer", "schedule"),
    "training": ("warmup_epochs", "bn_freeze", "grad_clip", "followup"),
    "validation": ("validation", "asap"),
}
MARKER = "<!-- run-config keys: {table}; generated by python -m dmlrepro.train.config_keys --markdown -->"
END_MARKER = "<!-- end run-config keys -->"


def _doc_table(key_name: str) -> str:
    first = key_name.split(".")[0]
    return next((table for table, firsts in DOC_TABLES.items() if first in firsts), "run")


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _rows(key: Key, prefix: str = "") -> list[str]:
    name, tags = prefix + key.name, []
    if key.late or any(section.late and name.startswith(section.name + ".") for section in SECTIONS):
        tags.append("late")
    if key.runtime or any(section.runtime and name.startswith(section.name + ".") for section in SECTIONS):
        tags.append("runtime")
    cells = [
        f"`{name}`" + (f" ({', '.join(tags)})" if tags else ""),
        f"`{_yaml(key.default)}`",
        key.check.describe(),
        key.doc,
    ]
    rows = ["| " + " | ".join(cell.replace("|", "\\|") if i < 3 else cell for i, cell in enumerate(cells)) + " |"]
    for field_key in getattr(key.check, "fields", ()):
        rows += _rows(field_key, prefix=name + ".")
    return rows


def markdown_table(table: str) -> str:
    """One of docs/training.md's key tables, between its marker comments."""
    rows = [row for key in KEYS if _doc_table(key.name) == table for row in _rows(key)]
    return "\n".join(
        [MARKER.format(table=table), "| key | default | values | meaning |", "|---|---|---|---|", *rows, END_MARKER]
    )


def markdown_tables() -> dict[str, str]:
    return {table: markdown_table(table) for table in [*DOC_TABLES, "run"]}


def update_docs(text: str) -> str:
    """``text`` with each marked key table replaced by the generated one."""
    for table, generated in markdown_tables().items():
        pattern = re.escape(MARKER.format(table=table)) + r".*?" + re.escape(END_MARKER)
        text, count = re.subn(pattern, lambda _: generated, text, flags=re.DOTALL)  # noqa: B023 (called here)
        if count != 1:
            raise ValueError(f"expected one marked run-config key table {table!r}, found {count}")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dmlrepro.train.config_keys", description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print docs/training.md's key tables")
    parser.add_argument("--write", metavar="DOC", help="replace the marked key tables in DOC (docs/training.md)")
    args = parser.parse_args(argv)
    if args.write:
        path = Path(args.write)
        path.write_text(update_docs(path.read_text(encoding="utf-8")), encoding="utf-8")
    if args.markdown or not args.write:
        print("\n\n".join(markdown_tables().values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
