"""Batch samplers whose order is a pure function of (seed, epoch), so a run can resume mid-epoch.

Both are ``batch_sampler``s for ``torch.utils.data.DataLoader(dataset, batch_sampler=...)``:
call ``set_epoch(epoch, start_batch=i)`` before iterating to get that epoch's batches from batch
``i`` on; ``epoch_batches(epoch)`` returns the full list (e.g. to log or check it).

* ``RandomBatchSampler``: a seeded permutation cut into batches; ``drop_last`` drops the last
  short batch (the Proxy-Anchor code's default; docs/readings/pfml.md#pfml-r14).
* ``MPerClassBatchSampler``: pytorch-metric-learning's ``MPerClassSampler`` (batch_size/m
  classes, m images each; with replacement only for classes with fewer than m images), drawn
  from a RandomState seeded by (seed, epoch) instead of numpy's global state.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler


def _epoch_seed(seed: int, epoch: int) -> np.ndarray:
    return np.random.SeedSequence([int(seed), int(epoch)]).generate_state(4)


class _ResumableBatchSampler(Sampler[list[int]]):
    def __init__(self, seed: int):
        self.seed = int(seed)
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        n = self.num_batches()
        if not 0 <= start_batch <= n:
            raise ValueError(f"{type(self).__name__}: start_batch {start_batch} outside [0, {n}]")
        self.epoch, self.start_batch = int(epoch), int(start_batch)

    def num_batches(self) -> int:
        raise NotImplementedError

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.epoch_batches(self.epoch)[self.start_batch :]

    def __len__(self) -> int:
        return self.num_batches() - self.start_batch


class RandomBatchSampler(_ResumableBatchSampler):
    """Shuffled batches over ``range(n)``; ``drop_last`` drops a final incomplete batch."""

    def __init__(self, n: int, batch_size: int, seed: int = 0, drop_last: bool = True):
        super().__init__(seed)
        if batch_size < 1 or n < 1:
            raise ValueError(f"RandomBatchSampler: need n >= 1 and batch_size >= 1, got n={n}, batch_size={batch_size}")
        self.n, self.batch_size, self.drop_last = int(n), int(batch_size), bool(drop_last)

    def num_batches(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        perm = np.random.default_rng(_epoch_seed(self.seed, epoch)).permutation(self.n)
        return [perm[i * self.batch_size : (i + 1) * self.batch_size].tolist() for i in range(self.num_batches())]


def pml_m_per_class_indices(
    labels: Sequence[int], m: int, batch_size: int, length_before_new_iter: int, rng: np.random.RandomState
) -> list[int]:
    """One pass of pytorch-metric-learning's ``MPerClassSampler(labels, m, batch_size,
    length_before_new_iter)``: the same index sequence as its ``__iter__`` when its module-level
    ``c_f.NUMPY_RANDOM`` is ``rng`` (tests/data/test_samplers.py compares the two). Defined here so
    that a training job does not import ``pytorch_metric_learning.samplers``, whose package import
    pulls in scikit-learn, pandas and scipy.stats (its testers), a cost a miniature training job
    feels (docs/benchmarks.md#the-embedded-default-cpu-seconds-by-job-kind).

    As PML: classes in first-appearance order, the image count rounded down to a multiple of
    ``batch_size``; per batch the class list is shuffled in place (``rng.shuffle``), its first
    ``batch_size // m`` classes each draw ``rng.choice(indices, m, replace=len(indices) < m)``."""
    to_indices: dict = defaultdict(list)
    for i, label in enumerate(labels):
        to_indices[label].append(i)
    to_indices = {k: np.array(v, dtype=int) for k, v in to_indices.items()}
    classes = list(to_indices)
    size = length_before_new_iter - length_before_new_iter % batch_size
    out: list[int] = []
    for _ in range(size // batch_size if batch_size < size else 1):
        rng.shuffle(classes)
        for label in classes[: batch_size // m]:
            idx = to_indices[label]
            out.extend(rng.choice(idx, size=m, replace=len(idx) < m).tolist())
    return out


class MPerClassBatchSampler(_ResumableBatchSampler):
    """Batches of ``batch_size // m`` classes with ``m`` images each (PML ``MPerClassSampler``).

    ``length_before_new_iter``: images per epoch (default: the dataset size), rounded down to a
    multiple of ``batch_size`` as PML does; MLRC's "100 iterations per epoch" is 100 * batch_size.
    """

    def __init__(
        self, labels: Sequence[int], m: int, batch_size: int, seed: int = 0, length_before_new_iter: int | None = None
    ):
        super().__init__(seed)
        labels = np.asarray(labels.numpy() if isinstance(labels, torch.Tensor) else labels)
        n_classes = len(np.unique(labels))
        if batch_size % m or batch_size // m > n_classes:
            raise ValueError(
                f"MPerClassBatchSampler: batch_size {batch_size} must be a multiple of m={m} and hold at most "
                f"{n_classes} classes (the number of classes in the data)"
            )
        length = len(labels) if length_before_new_iter is None else int(length_before_new_iter)
        self.batch_size, self.m = int(batch_size), int(m)
        self._labels = labels
        self._length = max(length, batch_size)  # PML asserts length_before_new_iter >= batch_size

    def num_batches(self) -> int:
        return self._length // self.batch_size

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.RandomState(_epoch_seed(self.seed, epoch))
        flat = pml_m_per_class_indices(self._labels, self.m, self.batch_size, self._length, rng)
        b = self.batch_size
        return [flat[i * b : (i + 1) * b] for i in range(len(flat) // b)]
