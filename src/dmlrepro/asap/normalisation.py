"""Lipschitz-continuous "L2 normalisation" of ASAP (paper §4.4, Lemma 4.1, App. B.1; spec §1.9).

    v̂ = v                if ‖v‖₂ ≤ 1
      = v / ‖v‖₂         if ‖v‖₂ > 1          i.e. v̂ = v / max(1, ‖v‖₂)

Unlike v/‖v‖ it is continuous at the origin (the paper calls it 2-Lipschitz). It is applied to the
embeddings *and* to the proxies, in training and in evaluation (spec §1.9).

`mode` switches the transform for ablations: ``"lipschitz"`` (the paper), ``"l2"`` (hard v/‖v‖, the
usual DML choice) and ``"none"``.
"""

from __future__ import annotations

import torch

MODES = ("lipschitz", "l2", "none")


def lipschitz_normalize(v: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v / max(1, ‖v‖₂) along `dim` (paper §4.4)."""
    return v / torch.linalg.vector_norm(v, dim=dim, keepdim=True).clamp_min(1.0)


def normalize(v: torch.Tensor, mode: str = "lipschitz", dim: int = -1) -> torch.Tensor:
    """The embedding transform called `mode` (one of `MODES`)."""
    if mode == "lipschitz":
        return lipschitz_normalize(v, dim)
    if mode == "l2":
        return v / torch.linalg.vector_norm(v, dim=dim, keepdim=True).clamp_min(1e-12)
    if mode == "none":
        return v
    raise ValueError(f"normalize: mode must be one of {MODES}, got {mode!r}")
