from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dmlrepro.data.samplers import MPerClassBatchSampler, RandomBatchSampler


@pytest.fixture
def labels():
    rng = np.random.default_rng(0)
    sizes = rng.integers(4, 15, size=30)
    return np.repeat(np.arange(30), sizes)


def test_m_per_class(labels):
    s = MPerClassBatchSampler(labels, m=4, batch_size=32, seed=1)
    batches = s.epoch_batches(0)
    assert len(batches) == len(labels) // 32 == len(s)
    for b in batches:
        assert len(b) == 32
        counts = Counter(labels[b].tolist())
        assert len(counts) == 8 and set(counts.values()) == {4}
        assert len(set(b)) == 32  # every class has >= m images: no repeats inside a class


def test_m_per_class_deterministic_and_resumable(labels):
    s = MPerClassBatchSampler(labels, m=4, batch_size=32, seed=1)
    s2 = MPerClassBatchSampler(labels, m=4, batch_size=32, seed=1)
    state = np.random.get_state()[1].copy()
    e0, e1 = s.epoch_batches(0), s.epoch_batches(1)
    assert np.array_equal(np.random.get_state()[1], state)  # global numpy RNG untouched
    assert s2.epoch_batches(1) == e1 and s.epoch_batches(0) == e0  # order independent of history
    assert e0 != e1
    assert MPerClassBatchSampler(labels, m=4, batch_size=32, seed=2).epoch_batches(0) != e0
    s.set_epoch(1, start_batch=3)
    assert list(s) == e1[3:] and len(s) == len(e1) - 3


def test_m_per_class_length_and_errors(labels):
    s = MPerClassBatchSampler(labels, m=4, batch_size=32, seed=0, length_before_new_iter=100 * 32)
    assert len(s.epoch_batches(0)) == 100
    with pytest.raises(ValueError, match="multiple of m"):
        MPerClassBatchSampler(labels, m=4, batch_size=30)
    with pytest.raises(ValueError, match="at most 30 classes"):
        MPerClassBatchSampler(labels, m=4, batch_size=31 * 4)


@pytest.mark.parametrize("drop_last, n_batches", [(True, 3), (False, 4)])
def test_random_drop_last(drop_last, n_batches):
    s = RandomBatchSampler(10, 3, seed=0, drop_last=drop_last)
    b = s.epoch_batches(0)
    assert len(b) == len(s) == n_batches
    flat = sum(b, [])
    assert len(set(flat)) == len(flat)
    if drop_last:
        assert all(len(x) == 3 for x in b) and len(flat) == 9
    else:
        assert sorted(flat) == list(range(10)) and len(b[-1]) == 1


def test_random_deterministic_and_resumable():
    s = RandomBatchSampler(100, 8, seed=7)
    e2 = s.epoch_batches(2)
    assert RandomBatchSampler(100, 8, seed=7).epoch_batches(2) == e2
    assert s.epoch_batches(3) != e2 and RandomBatchSampler(100, 8, seed=8).epoch_batches(2) != e2
    s.set_epoch(2, start_batch=5)
    assert list(s) == e2[5:]
    with pytest.raises(ValueError, match="start_batch"):
        s.set_epoch(0, start_batch=13)


def test_with_dataloader(labels):
    ds = TensorDataset(torch.arange(len(labels)), torch.as_tensor(labels))
    s = MPerClassBatchSampler(labels, m=2, batch_size=16, seed=0)
    s.set_epoch(4, start_batch=2)
    got = [x.tolist() for x, _ in DataLoader(ds, batch_sampler=s)]
    assert got == s.epoch_batches(4)[2:]


def _pml_reference(labels, m, batch_size, length, seed, epoch):
    """pytorch-metric-learning's own MPerClassSampler, run with its NUMPY_RANDOM set to the
    epoch's RandomState (seeded by SeedSequence([seed, epoch]), the sampler's documented seeding)."""
    from pytorch_metric_learning.samplers import MPerClassSampler
    from pytorch_metric_learning.utils import common_functions as c_f

    saved = c_f.NUMPY_RANDOM
    try:
        c_f.NUMPY_RANDOM = np.random.RandomState(np.random.SeedSequence([seed, epoch]).generate_state(4))
        return [int(i) for i in MPerClassSampler(labels, m, batch_size=batch_size, length_before_new_iter=length)]
    finally:
        c_f.NUMPY_RANDOM = saved


_LAYOUTS = {
    "uneven": np.repeat(np.arange(30), np.random.default_rng(0).integers(4, 15, size=30)),
    "fewer_than_m": np.repeat(np.arange(12), np.random.default_rng(1).integers(1, 7, size=12)),
    "interleaved_unsorted": np.random.default_rng(2).permutation(
        np.repeat([7, 3, 100, 42, 5, 9, 11, 0], [9, 2, 5, 13, 4, 1, 8, 6])
    ),
}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
@pytest.mark.parametrize(
    "m, batch_size, length", [(4, 16, None), (2, 8, 1000), (4, 8, 37), (1, 4, 3), (2, 16, 100 * 16)]
)
def test_m_per_class_equals_pml(layout, m, batch_size, length):
    labels = _LAYOUTS[layout]
    s = MPerClassBatchSampler(
        torch.as_tensor(labels), m=m, batch_size=batch_size, seed=5, length_before_new_iter=length
    )
    pml_length = max(len(labels) if length is None else length, batch_size)
    for epoch in range(3):
        ref = _pml_reference(labels, m, batch_size, pml_length, seed=5, epoch=epoch)
        assert sum(s.epoch_batches(epoch), []) == ref
        assert len(s.epoch_batches(epoch)) == len(ref) // batch_size
