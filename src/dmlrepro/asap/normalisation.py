"""Lipschitz-continuous "L2 normalisation" of ASAP (paper §4.4, Lemma 4.1, App. B.1).

    v̂ = v                if ‖v‖₂ ≤ 1
      = v / ‖v‖₂         if ‖v‖₂ > 1          i.e. v̂ = v / max(1, ‖v‖₂)

Unlike v/‖v‖ it is continuous at the origin (the paper calls it 2-Lipschitz). It is applied to the
embeddings *and* to the proxies (docs/readings/asap.md#asap-r31), in training and in evaluation
(App. A.2 "Embedding vectors": "During training and evaluation, the embedding vectors are L2
normalized using the transformation proposed in Section 4.4").

`mode` switches the transform for ablations: ``"lipschitz"`` (the paper), ``"l2"`` (hard v/‖v‖, the
usual DML choice) and ``"none"``. :func:`normalize_array` is the same transform on saved (numpy)
embeddings; the run-config key ``eval.normalize`` applies it before every test and validation
metric (docs/readings/asap.md#asap-r32).
"""

from __future__ import annotations

import numpy as np
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


def normalize_array(x: np.ndarray, mode: str = "lipschitz") -> np.ndarray:
    """`normalize` on an (N, D) numpy array (norms in float64), returned as float32."""
    if mode not in MODES:
        raise ValueError(f"normalize_array: mode must be one of {MODES}, got {mode!r}")
    a = np.asarray(x)
    if mode == "none":
        return a.astype(np.float32, copy=False)
    norms = np.linalg.norm(a.astype(np.float64), axis=-1, keepdims=True)
    scale = np.maximum(norms, 1.0) if mode == "lipschitz" else np.maximum(norms, 1e-12)
    return (a / scale).astype(np.float32)
