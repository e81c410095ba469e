"""Batch samplers whose order is a pure function of (seed, epoch), so a run can resume mid-epoch.

Both are ``batch_sampler``s for ``torch.utils.data.DataLoader(dataset, batch_sampler=...)``:
call ``set_epoch(epoch, start_batch=i)`` before iterating to get that epoch's batches from batch
``i`` on; ``epoch_batches(epoch)`` returns the full list (e.g. to log or check it).

* ``RandomBatchSampler``: a seeded permutation cut into batches; ``drop_last`` drops the last
  short batch (the Proxy-Anchor code's default; docs/readings/pfml.md#pfml-r14).
* ``MPerClassBatchSampler``: wraps pytorch-metric-learning's ``MPerClassSampler`` (batch_size/m
  classes, m images each; with replacement only for classes with fewer than m images), run
  under a RandomState seeded by (seed, epoch) instead of numpy's global state.
"""

from __future__ import annotations

import threading
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

_PML_LOCK = threading.Lock()


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


class MPerClassBatchSampler(_ResumableBatchSampler):
    """Batches of ``batch_size // m`` classes with ``m`` images each (PML ``MPerClassSampler``).

    ``length_before_new_iter``: images per epoch (default: the dataset size), rounded down to a
    multiple of ``batch_size`` as PML does; MLRC's "100 iterations per epoch" is 100 * batch_size.
    """

    def __init__(self, labels: Sequence[int], m: int, batch_size: int, seed: int = 0, length_before_new_iter: int | None = None):
        super().__init__(seed)
        from pytorch_metric_learning.samplers import MPerClassSampler

        labels = np.asarray(labels.numpy() if isinstance(labels, torch.Tensor) else labels)
        n_classes = len(np.unique(labels))
        if batch_size % m or batch_size // m > n_classes:
            raise ValueError(
                f"MPerClassBatchSampler: batch_size {batch_size} must be a multiple of m={m} and hold at most "
                f"{n_classes} classes (the number of classes in the data)"
            )
        length = len(labels) if length_before_new_iter is None else int(length_before_new_iter)
        self.batch_size, self.m = int(batch_size), int(m)
        self._inner = MPerClassSampler(labels, m, batch_size=batch_size, length_before_new_iter=max(length, batch_size))
        self._labels0 = list(self._inner.labels)  # PML shuffles this list in place; restore per epoch

    def num_batches(self) -> int:
        return len(self._inner) // self.batch_size

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        from pytorch_metric_learning.utils import common_functions as c_f

        with _PML_LOCK:
            saved = c_f.NUMPY_RANDOM
            try:
                c_f.NUMPY_RANDOM = np.random.RandomState(_epoch_seed(self.seed, epoch))
                self._inner.labels = list(self._labels0)
                flat = [int(i) for i in self._inner.__iter__()]
            finally:
                c_f.NUMPY_RANDOM = saved
        b = self.batch_size
        return [flat[i * b : (i + 1) * b] for i in range(len(flat) // b)]
