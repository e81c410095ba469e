"""What the losses written here share: float32 at least with autocast off, and the check of their inputs.

PFML's energies and RSW's logits overflow or lose their small differences in half precision
(docs/readings/pfml.md#pfml-r7), so each computes in float32 (float64 inputs stay float64) whatever
autocast the engine runs the network under; ASAP's pair losses (`asap.py`, `xbm.py`) do the same.
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def full_precision(embeddings: torch.Tensor):
    """Autocast off on the embeddings' device; yields the loss's dtype: float32, or float64 for float64 inputs."""
    with torch.autocast(embeddings.device.type, enabled=False):
        yield torch.promote_types(embeddings.dtype, torch.float32)


def check_embeddings(owner: object, embeddings: torch.Tensor, embedding_size: int | None) -> None:
    """ValueError naming the loss unless `embeddings` is (B, embedding_size), or (B, D) for any D if None."""
    if embeddings.ndim != 2 or embedding_size not in (None, embeddings.shape[1]):
        raise ValueError(
            f"{type(owner).__name__}: embeddings must be (B, {embedding_size or 'D'}), got {tuple(embeddings.shape)}"
        )
