"""Adapter from the run config's ``dataset`` section to the data layer (``dmlrepro.data``).

* ``open_manifest``: prepares an embedded dataset on first use (``dataset.prepare``), else
  loads a prepared one (the error names the ``prepare`` command).
* ``build_datasets``: train/test ``ManifestDataset`` with the transforms matching the
  backbone's input convention, and the map from training labels to 0..C-1 for the loss.
* ``SeededBatchSampler`` / ``SeededDataset``: make every random augmentation a pure function of
  (seed, epoch, batch index, position in batch). Each sample is transformed under its own torch
  seed (the CPU generator's state is restored afterwards, so the caller's stream is untouched), hence the
  data stream is identical whatever ``num_workers`` is and when training resumes mid-epoch.
"""

from __future__ import annotations

import signal
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from dmlrepro import data
from dmlrepro.data import ManifestDataset, MPerClassBatchSampler, RandomBatchSampler, write_noisy_labels
from dmlrepro.data.label_noise import label_noise_path
from dmlrepro.data.multidigit import SPECS as MULTIDIGIT
from dmlrepro.data.registry import EMBEDDED
from dmlrepro.data.splits import has_validation_split, split_indices

from .config import ConfigError, section_value

#: datasets whose ``dataset.params`` the run prepares with: the embedded ones, and the multi-digit ones made
#: from the prepared ``mnist`` under the same root (rule prepare_dataset made them; a run only finds them).
#: With ``prepare: false`` a multi-digit run reads the copy under the root as it is (a preflight's stand-in)
PARAMETRISED = (*EMBEDDED, *MULTIDIGIT)


def open_manifest(dataset_cfg: dict[str, Any]):
    name, root = dataset_cfg["name"], dataset_cfg["root"]
    if name in PARAMETRISED and dataset_cfg["prepare"]:
        try:
            data.prepare(name, root, progress=False, **dict(dataset_cfg["params"]))
        except TypeError as e:
            raise ConfigError(f"run config: dataset.params = {dict(dataset_cfg['params'])!r}: {e}") from None
    elif dataset_cfg["params"] and name not in MULTIDIGIT:
        raise ConfigError(
            f"run config: dataset.params = {dict(dataset_cfg['params'])!r}: only for multi-digit datasets, or "
            f"embedded ones with dataset.prepare: true"
        )
    try:
        return data.load(name, root)
    except Exception as e:
        raise FileNotFoundError(
            f"dataset {name!r} is not prepared under {root!r} ({e}); run `dmlrepro prepare {name} --root {root}` first"
        ) from None


def _normalization(dataset_cfg: dict[str, Any], model) -> tuple[str, Any]:
    """The data layer's normalisation name (+ an extra transform for ViT's mean = std = 0.5)."""
    norm = dataset_cfg["normalization"]
    if norm == "auto":
        norm = {"rgb_imagenet": "imagenet", "bgr255": "bninception", "rgb_half": "half"}.get(
            getattr(model, "input_convention", ""), "imagenet"
        )
    if norm == "half":  # not offered by dmlrepro.data.transforms: [0, 1] then (x - 0.5) / 0.5
        from torchvision.transforms import v2  # deferred: torchvision, only where transforms are built

        return "none", v2.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    return norm, None


def build_transforms(dataset_cfg: dict[str, Any], model, corruption=None):
    """(train, eval) transforms; `corruption` (dmlrepro.data.corruptions) is applied to the eval
    transform's uint8 centre crop before normalisation (RSW Table IV)."""
    from torchvision.transforms import v2  # deferred: torchvision, only where transforms are built

    from dmlrepro.data import build_transform  # deferred: imports torchvision

    norm, extra = _normalization(dataset_cfg, model)
    common = dict(
        size=dataset_cfg["image_size"],
        resize=dataset_cfg["resize"],
        resize_mode=dataset_cfg["resize_mode"],
        normalization=norm,
    )
    train = build_transform(
        True,
        **common,
        scale=tuple(dataset_cfg["scale"]),
        ratio=tuple(dataset_cfg["ratio"]),
        train_resize=dataset_cfg["train_resize"],
        train_crop=dataset_cfg["train_crop"],
        hflip=dataset_cfg["hflip"],
    )
    test = build_transform(False, **common, corruption=corruption)
    if extra is not None:
        train, test = v2.Compose([train, extra]), v2.Compose([test, extra])
    return train, test


class LabelMap:
    """Training labels (any ints) -> 0..C-1 in sorted order, as a lookup table."""

    def __init__(self, labels: np.ndarray):
        self.classes = np.unique(np.asarray(labels))
        self.table = torch.full((int(self.classes.max()) + 1,), -1, dtype=torch.long)
        self.table[torch.as_tensor(self.classes, dtype=torch.long)] = torch.arange(len(self.classes))

    def __len__(self) -> int:
        return len(self.classes)

    def __call__(self, labels: torch.Tensor) -> torch.Tensor:
        return self.table.to(labels.device)[labels]


def noisy_labels(dataset_cfg: dict[str, Any], manifest, rows=None) -> str | None:
    """The noisy-label file of the run, written first if missing (deterministic, atomic), or None;
    `rows`: the training rows of a validation split, the only rows corrupted (PFML Table 2 corrupts
    the labels a run trains on, never into a held-out class)."""
    if dataset_cfg["label_noise"] is None:
        return dataset_cfg["label_noise_file"]
    path = label_noise_path(dataset_cfg, rows)
    if not path.is_file():
        n = dataset_cfg["label_noise"]
        write_noisy_labels(
            manifest, path, seed=n["seed"], rate=n["rate"], mode=n["mode"], split=dataset_cfg["train_split"], rows=rows
        )
    return str(path)


def validation_rows(validation_cfg: dict[str, Any] | None, manifest) -> tuple[np.ndarray, np.ndarray] | None:
    """(train rows, validation rows) of the run's validation split of the training split
    (``validation.split``: fold k of n_folds or RSW's 50/50 holdout, class-disjoint; or
    ``samples``, a fraction of each class's images), or None."""
    if not has_validation_split(validation_cfg):
        return None
    # a run's stored identity (config.yaml, the report's run records) drops `fraction` at its late default
    fraction = section_value(validation_cfg, "validation.fraction")
    kw = dict(
        fold=validation_cfg["fold"],
        n_folds=validation_cfg["n_folds"],
        scheme=validation_cfg["scheme"],
        fraction=fraction,
    )
    try:
        return tuple(split_indices(manifest, f"{validation_cfg['split']}_{part}", **kw) for part in ("train", "val"))
    except ValueError as e:
        raise ConfigError(f"run config: validation = {dict(validation_cfg)!r}: {e}") from None


def build_datasets(dataset_cfg: dict[str, Any], manifest, model, validation_cfg: dict[str, Any] | None = None):
    """(train, test, label map); with a validation split the training set keeps only its
    training classes (the validation set is :func:`build_validation`'s)."""
    train_tf, test_tf = build_transforms(dataset_cfg, model)
    rows = validation_rows(validation_cfg, manifest)
    train_rows = None if rows is None else rows[0]
    train = ManifestDataset(
        manifest,
        split=dataset_cfg["train_split"],
        indices=train_rows,
        transform=train_tf,
        label_override=noisy_labels(dataset_cfg, manifest, train_rows),
        cache_images=dataset_cfg.get("cache_images", False),
    )
    test = ManifestDataset(
        manifest,
        split=dataset_cfg["test_split"],
        transform=test_tf,
        cache_images=dataset_cfg.get("cache_images", False),
    )
    return train, test, LabelMap(train.labels)


def build_validation(dataset_cfg: dict[str, Any], validation_cfg: dict[str, Any], manifest, model):
    """The validation classes of the training split with the eval transform (true labels)."""
    return ManifestDataset(
        manifest,
        indices=validation_rows(validation_cfg, manifest)[1],
        transform=build_transforms(dataset_cfg, model)[1],
        cache_images=dataset_cfg.get("cache_images", False),
    )


def build_gallery(dataset_cfg: dict[str, Any], manifest, model):
    """The gallery of query→gallery evaluation (eval transform), or None without `dataset.gallery_split`."""
    if dataset_cfg["gallery_split"] is None:
        return None
    return ManifestDataset(
        manifest, split=dataset_cfg["gallery_split"], transform=build_transforms(dataset_cfg, model)[1]
    )


def build_train_eval(dataset_cfg: dict[str, Any], manifest, model, rows=None):
    """The training split (or its `rows`) with the eval transform (no augmentation) and the labels the
    run trains on (its noisy ones under label noise: the proxies' classes), for proxy–data measures."""
    return ManifestDataset(
        manifest,
        split=dataset_cfg["train_split"],
        indices=rows,
        transform=build_transforms(dataset_cfg, model)[1],
        label_override=noisy_labels(dataset_cfg, manifest, rows),
        cache_images=dataset_cfg.get("cache_images", False),
    )


def build_test_corrupted(dataset_cfg: dict[str, Any], manifest, model, corruption, decoded=None):
    """The test split with the eval transform followed by `corruption` (RSW Table IV); given
    `decoded` (one built here before), its decoded images (with `dataset.cache_images`) serve this one."""
    transform = build_transforms(dataset_cfg, model, corruption)[1]
    if decoded is not None:
        return decoded.with_transform(transform)
    return ManifestDataset(
        manifest,
        split=dataset_cfg["test_split"],
        transform=transform,
        cache_images=dataset_cfg.get("cache_images", False),
    )


def build_batch_sampler(dataset_cfg: dict[str, Any], train_ds, seed: int):
    if dataset_cfg["sampler"] == "random":
        if dataset_cfg["batch_size"] > len(train_ds):
            raise ConfigError(
                f"run config: dataset.batch_size = {dataset_cfg['batch_size']}: expected at most the "
                f"{len(train_ds)} training images"
            )
        return RandomBatchSampler(len(train_ds), dataset_cfg["batch_size"], seed=seed, drop_last=True)
    try:
        return MPerClassBatchSampler(
            train_ds.labels,
            dataset_cfg["m"],
            dataset_cfg["batch_size"],
            seed=seed,
            length_before_new_iter=dataset_cfg["length_before_new_iter"],
        )
    except ValueError as e:
        raise ConfigError(f"run config: dataset.batch_size/dataset.m: {e}") from None


def _batch_seed(seed: int, epoch: int, batch: int) -> int:
    return int(np.random.SeedSequence([int(seed), 0x5EED, int(epoch), int(batch)]).generate_state(1, np.uint64)[0] >> 2)


class SeededBatchSampler(Sampler):
    """Wraps a resumable data-layer batch sampler: yields ``[(index, sample_seed), ...]``,
    at most ``limit`` batches per epoch, from ``start_batch`` on (see ``set_epoch``)."""

    def __init__(self, inner, seed: int, limit: int | None = None):
        self.inner, self.seed, self.limit = inner, int(seed), limit
        self.epoch, self.start_batch = 0, 0

    def num_batches(self) -> int:
        n = self.inner.num_batches()
        return n if self.limit is None else min(n, self.limit)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        if not 0 <= start_batch <= self.num_batches():
            raise ValueError(f"start_batch {start_batch} outside [0, {self.num_batches()}]")
        self.epoch, self.start_batch = int(epoch), int(start_batch)

    def __iter__(self):
        batches = self.inner.epoch_batches(self.epoch)[: self.num_batches()]
        for b in range(self.start_batch, len(batches)):
            base = _batch_seed(self.seed, self.epoch, b)
            yield [(int(i), base + position) for position, i in enumerate(batches[b])]

    def __len__(self) -> int:
        return self.num_batches() - self.start_batch


class SeededDataset(Dataset):
    """``ds[(i, seed)]`` = ``ds[i]`` with torch's generator seeded by ``seed`` for the transform
    (``seed`` None: ``ds[i]`` as is)."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, key):
        i, s = key
        if s is None:  # no random transform to seed (evaluation)
            return self.ds[int(i)]
        gen = torch.default_generator  # torch.manual_seed would also record a stack trace per call
        saved = gen.get_state()
        gen.manual_seed(int(s))
        try:
            return self.ds[int(i)]
        finally:
            gen.set_state(saved)

    def __getitems__(self, keys):
        """A batch at once (the DataLoader's fetcher calls this): the dataset's ``seeded_batch``
        where it has one (the same items, bit for bit: tests/data/test_transforms.py), else item by item."""
        batched = getattr(self.ds, "seeded_batch", None)
        items = batched(keys) if batched is not None else None
        return items if items is not None else [self[key] for key in keys]


def worker_init(_worker_id: int) -> None:
    """DataLoader workers ignore the preemption signals; the main process handles them."""
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):  # USR2: submitit's handler would exit the worker
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):  # pragma: no cover
            pass


def loader_generator(seed: int, epoch: int, salt: int) -> torch.Generator:
    """A DataLoader's own generator (its worker base seed), a function of (seed, epoch)."""
    g = torch.Generator()
    g.manual_seed(int(np.random.SeedSequence([int(seed), int(salt), int(epoch)]).generate_state(1, np.uint64)[0] >> 2))
    return g
