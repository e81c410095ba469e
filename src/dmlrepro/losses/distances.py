"""Euclidean distances with finite gradients everywhere (specs/pfml.md §1.7, rsw.md §1.7).

The squared distance is clamped *before* the square root: at coincident points the clamp's
gradient is 0, so the (finite) derivative of sqrt at `eps2` is multiplied by 0 and no NaN appears.
"""

from __future__ import annotations

import torch

EPS2 = 1e-12


def pairwise_distances(a: torch.Tensor, b: torch.Tensor, eps2: float = EPS2) -> torch.Tensor:
    """(P, D), (Q, D) -> (P, Q) Euclidean distances, expanded form ‖a‖² + ‖b‖² − 2 a·b."""
    d2 = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1).unsqueeze(-2) - 2.0 * (a @ b.transpose(-1, -2))
    return d2.clamp_min(eps2).sqrt()


def paired_distances(a: torch.Tensor, b: torch.Tensor, eps2: float = EPS2) -> torch.Tensor:
    """Row-wise ‖a_i − b_i‖ for equally shaped (..., D) tensors (difference form: no cancellation)."""
    diff = a - b
    return (diff * diff).sum(-1).clamp_min(eps2).sqrt()


def squared_distances_nograd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(P, D), (Q, D) -> (P, Q) squared distances for neighbour searches (no autograd graph)."""
    with torch.no_grad():
        return ((a * a).sum(-1, keepdim=True) + (b * b).sum(-1)[None, :] - 2.0 * (a @ b.T)).clamp_min_(0.0)


def search_tolerance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Absolute error bound on a squared distance from `squared_distances_nograd`, with margin.

    The expanded form loses about eps·(‖a‖ + ‖b‖)² to cancellation; a neighbour search widens its
    squared radius by this much so that rounding can only add candidates, never drop one.
    """
    eps = torch.finfo(a.dtype).eps
    reach = float(a.detach().norm(dim=-1).max()) if a.numel() else 0.0
    reach += float(b.detach().norm(dim=-1).max()) if b.numel() else 0.0
    return 64.0 * eps * (reach * reach + 1.0)
