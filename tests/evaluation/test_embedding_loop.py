"""The embedding loop at inference speed (dmlrepro.train.embedder.embed_batches and its users):
the same float32 embeddings as a plain forward pass, forward passes in inference mode while the
dataset is read outside it, the embeddings read by the host once per pass (never per batch), no
device synchronisation inside a pass on CUDA; and the preflight's evaluation measurement: the
loop over one in-memory batch of the run's evaluation size after a warm-up pass, the metrics
timed apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlrepro.train.embedder import Embedder, embed_batches
from dmlrepro.train.run_evaluation import compute_embeddings

CPU = torch.device("cpu")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 6),
    )


class _Images(torch.utils.data.Dataset):
    """50 random 3×12×12 images in 4 classes; records whether each read ran in inference mode."""

    def __init__(self, n: int = 50):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 3, 12, 12, generator=g), torch.arange(n) % 4
        self.rows, self.labels, self.read_in_inference_mode = np.arange(n), self.y.numpy(), set()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        self.read_in_inference_mode.add(torch.is_inference_mode_enabled())
        return self.x[i], self.y[i], i


def _plain(model, ds, batch_size: int) -> np.ndarray:
    """The reference: a plain batched forward pass of the eval-mode model."""
    model.eval()
    with torch.no_grad():
        return torch.cat([model(ds.x[s : s + batch_size]) for s in range(0, len(ds), batch_size)]).numpy()


def test_every_path_gives_the_plain_forward_pass_bit_for_bit():
    model, ds = _model(), _Images()
    model.train()
    ref = _plain(model, ds, 16)
    model.train()
    a, labels, rows = compute_embeddings(model, ds, batch_size=16, device=CPU)
    b, labels_b, _ = Embedder(model, CPU, batch_size=16).embed(ds)
    c = Embedder(model, CPU, batch_size=16).embed(ds, on_device=True)[0]
    assert model.training  # the loop restores the mode it found
    assert a.dtype == np.float32 and np.array_equal(a, ref) and np.array_equal(b, ref)
    assert np.array_equal(c.numpy(), ref)
    assert np.array_equal(labels, ds.y.numpy()) and np.array_equal(labels_b, ds.y.numpy())
    assert np.array_equal(rows, ds.rows)


def test_forward_passes_in_inference_mode_and_the_data_read_outside_it():
    model, ds = _model(), _Images()
    seen = []
    model.register_forward_pre_hook(lambda *_: seen.append(torch.is_inference_mode_enabled()))
    emb, _, _ = compute_embeddings(model, ds, batch_size=16, device=CPU, on_device=True)
    assert seen == [True] * 4
    # a dataset's cached images must stay ordinary tensors (a later training read may modify them)
    assert ds.read_in_inference_mode == {False}
    # the result is an ordinary tensor: usable where autograd records (ASAP's k-Center pools)
    assert not torch.is_inference(emb)
    (emb * torch.ones(6, requires_grad=True)).sum().backward()


def test_the_host_reads_the_embeddings_once_per_pass(monkeypatch):
    calls = []
    cpu = torch.Tensor.cpu

    def counted(self, *args, **kwargs):
        calls.append(tuple(self.shape))
        return cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    model, ds = _model(), _Images()
    emb, _, _ = Embedder(model, CPU, batch_size=8).embed(ds)  # 7 batches
    assert calls == [(50, 6)]
    calls.clear()
    compute_embeddings(model, ds, batch_size=8, device=CPU)
    assert calls == [(50, 6)]


@pytest.mark.cuda
def test_no_device_synchronisation_inside_a_pass(lane_device):
    """On CUDA, a pass of pinned batches neither waits for the device nor copies to the host
    (``torch.cuda.set_sync_debug_mode("error")`` raises at any synchronising call); its float32
    embeddings agree with the CPU's within float32 kernel differences."""
    device = torch.device(lane_device)
    model, ds = _model(), _Images()
    ref = _plain(model, ds, 16)
    model.to(device)
    batches = [(ds.x[s : s + 16], ds.y[s : s + 16]) for s in range(0, len(ds), 16)]
    if device.type == "cuda":
        batches = [(x.pin_memory(), y) for x, y in batches]
    embed_batches(model, batches, device)  # first-call costs (handles, workspaces) outside the check
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        emb, labels = embed_batches(model, batches, device)
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    assert emb.device.type == device.type and emb.dtype == torch.float32
    np.testing.assert_allclose(emb.cpu().numpy(), ref, rtol=0, atol=1e-4)
    assert torch.equal(labels, ds.y)
