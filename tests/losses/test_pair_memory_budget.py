"""How much memory "auto" and the proxy–proxy block may use per device (decided without a GPU here)."""

from __future__ import annotations

import pytest
import torch

from dmlrepro.losses import PFMLLoss, potential_field
from dmlrepro.losses.potential_field import DENSE_GPU_BYTES, PAIR_MEMORY_BYTES, pair_memory_budget

GiB = 2**30


def test_cpu_keeps_its_fixed_budget_whatever_the_memory():
    assert pair_memory_budget("cpu", None) == PAIR_MEMORY_BYTES
    assert pair_memory_budget("cpu", 512 * GiB) == PAIR_MEMORY_BYTES


def test_gpu_budget_is_an_eighth_of_its_memory_at_least_256_mib():
    assert pair_memory_budget("cuda", 80 * GiB) == 10 * GiB
    assert pair_memory_budget("cuda", 1 * GiB) == DENSE_GPU_BYTES == 256 * 2**20
    assert pair_memory_budget("cuda", None) == PAIR_MEMORY_BYTES  # memory unknown: the CPU's budget


def test_auto_is_dense_at_sop_scale_on_a_large_gpu(monkeypatch):
    """SOP: N·M = 22,636 proxies, 5.1e8 ordered pairs, 8.2 GB of pair matrices at 16 B nominal a pair."""
    loss = PFMLLoss(11318, 64, 2, delta=0.2, pair_search="auto")
    pairs, cuda = 22636**2, torch.device("cuda", 0)
    for total, sparse in ((80 * GiB, False), (40 * GiB, True)):
        monkeypatch.setattr(potential_field, "device_memory", lambda device, total=total: total)
        assert loss._sparse(pairs, potential_field.DENSE_PROXY_PAIRS, cuda) is sparse
    assert loss._sparse(pairs, potential_field.DENSE_PROXY_PAIRS, torch.device("cpu"))  # the CPU: near pairs only


def test_proxy_block_follows_the_devices_budget(monkeypatch):
    """The dense (n, n) proxy matrix, or row chunks sized by the budget, as `memory_budget` says."""
    torch.manual_seed(0)
    loss = PFMLLoss(40, 8, 3, delta=0.4, pair_search="dense")
    q = loss.proxies.detach()
    n = q.shape[0]
    dense = loss._different_class_proxies(q)
    assert loss.pair_path == "dense"
    monkeypatch.setattr(
        potential_field, "memory_budget", lambda device: n * n * potential_field.DENSE_BYTES_PER_PAIR - 1
    )
    chunked = loss._different_class_proxies(q)
    assert loss.pair_path == "chunked"
    assert chunked.item() == pytest.approx(dense.item(), rel=1e-6)
