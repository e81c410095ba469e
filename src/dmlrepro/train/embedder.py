"""One :class:`Embedder` per run: embeds datasets with the run's device, evaluation batch size
and loader workers, for test evaluation, validation, proxy metrics and ASAP's k-Center pools,
always in float32 whatever the run trains in (:func:`~dmlrepro.train.precision.float32_inference`).

Each dataset gets one DataLoader for the whole run (persistent workers when ``num_workers`` > 0,
pinned memory on CUDA): its batch sampler is a :class:`_Feed` whose batches are set before each
pass, so a pass costs no worker start-up. :func:`embed_batches` is the one embedding loop (also
``compute_embeddings``'s and the preflight's): forward passes under ``torch.inference_mode``, the
embeddings kept on the device and moved to the host once per pass, so the device never waits for
the host between batches. The stop flag (SIGTERM/SIGUSR1/SIGUSR2) is checked after every batch: a
pass that sees it raises :class:`EmbeddingInterrupted` (the engine then checkpoints and exits 75).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler
from tqdm import tqdm

from .precision import float32_inference
from .run_data import SeededDataset, loader_generator, worker_init


class EmbeddingInterrupted(Exception):
    """A preemption signal arrived while embedding (the pass is abandoned)."""


def embed_batches(
    model, batches: Iterable, device: torch.device, *, desc: str = "embed", stop: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 embeddings on ``device``, labels) of the ``(images, labels, ...)`` batches, in
    order, with ``model`` in eval mode (BN in inference mode) and in float32. The batches are read
    outside inference mode (a dataset's cached images stay ordinary tensors); nothing waits for the
    device until the caller reads the result. A true ``stop`` after a batch: :class:`EmbeddingInterrupted`."""
    was_training = model.training
    model.eval()
    out, labels = [], []
    try:
        with float32_inference(device):
            for x, y, *_ in batches:
                with torch.inference_mode():
                    out.append(model(x.to(device, non_blocking=True)).float())
                labels.append(y)
                if stop:
                    raise EmbeddingInterrupted(desc)
    finally:
        model.train(was_training)
    return torch.cat(out), torch.cat(labels)  # outside inference mode: ordinary tensors


class _Feed(Sampler):
    """A batch sampler whose batches (lists of ``(index, seed or None)``) are set before each pass."""

    def __init__(self):
        self.batches: list[list[tuple[int, int | None]]] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class Embedder:
    """Embeddings of a run's model (eval mode: BN in inference mode) over whole datasets or index lists."""

    def __init__(
        self,
        model,
        device: torch.device,
        *,
        batch_size: int,
        num_workers: int = 0,
        progress: bool = False,
        stop: Any = None,
    ):
        self.model, self.device = model, device
        self.batch_size, self.num_workers, self.progress, self.stop = int(batch_size), int(num_workers), progress, stop
        self._loaders: dict[int, tuple[Any, DataLoader, _Feed]] = {}

    def _loader(self, ds) -> tuple[DataLoader, _Feed]:
        """The dataset's persistent loader (built at its first pass)."""
        found = self._loaders.get(id(ds))
        if found is not None and found[0] is ds:
            return found[1], found[2]
        feed, nw = _Feed(), self.num_workers
        loader = DataLoader(
            SeededDataset(ds),
            batch_sampler=feed,
            num_workers=nw,
            persistent_workers=nw > 0,
            worker_init_fn=worker_init if nw else None,
            generator=loader_generator(0, 0, 17),
            pin_memory=self.device.type == "cuda",
        )
        self._loaders[id(ds)] = (ds, loader, feed)
        return loader, feed

    def batches(self, ds, batches: list[list[tuple[int, int | None]]], desc: str = "embed"):
        """The ``(images, labels, rows)`` batches of ``ds`` at the given ``(index, seed or None)``
        lists, through the dataset's persistent loader."""
        loader, feed = self._loader(ds)
        feed.batches = batches
        return tqdm(loader, desc=desc, disable=not self.progress, leave=False, dynamic_ncols=True)

    def _run(self, ds, batches, desc: str) -> tuple[torch.Tensor, torch.Tensor]:
        return embed_batches(self.model, self.batches(ds, batches, desc), self.device, desc=desc, stop=self.stop)

    def embed(self, ds, desc: str = "embed", on_device: bool = False):
        """(embeddings, labels, manifest rows) of every item of ``ds`` in order: float32 numpy, or a
        float32 tensor on the device with ``on_device`` (for the metrics to search there)."""
        n, b = len(ds), self.batch_size
        batches = [[(i, None) for i in range(s, min(s + b, n))] for s in range(0, n, b)]
        emb, labels = self._run(ds, batches, desc)
        return (emb if on_device else emb.cpu().numpy()), labels.numpy(), np.asarray(ds.rows, dtype=np.int64)

    def embed_seeded(self, ds, indices: torch.Tensor, base_seed: int, desc: str = "embed pool") -> torch.Tensor:
        """(n, D) float32 embeddings on the device of ``ds[indices[k]]``, item k transformed under
        the seed ``base_seed + k`` (ASAP's k-Center pools: augmentation a pure function of the run)."""
        idx, b = indices.tolist(), self.batch_size
        batches = [[(i, base_seed + s + j) for j, i in enumerate(idx[s : s + b])] for s in range(0, len(idx), b)]
        return self._run(ds, batches, desc)[0]

    def close(self) -> None:
        """Stop the loaders' worker processes."""
        for _, loader, _ in self._loaders.values():
            it = getattr(loader, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
            loader._iterator = None
        self._loaders.clear()
