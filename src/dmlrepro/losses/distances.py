"""Euclidean distances with finite gradients everywhere, and a conservative near-pair search.

Distances for the losses clamp the squared distance *before* the square root (docs/readings/pfml.md#pfml-r7,
the RSW code's Model.py): at coincident points the clamp's gradient is 0, so the finite derivative of sqrt at
`eps2` is multiplied by 0 and no NaN appears.

Near-pair searches only decide which pairs enter an exact evaluation, so they run as one GEMM in the
device's fastest exact-enough precision (`search_precision.py`: bfloat16 on CPUs with native bfloat16,
float32 elsewhere) with the squared radius widened by a rigorous rounding bound: rounding can add
candidates, never drop one.
"""

from __future__ import annotations

import torch

EPS2 = 1e-12


def pairwise_distances(a: torch.Tensor, b: torch.Tensor, eps2: float = EPS2) -> torch.Tensor:
    """(..., P, D), (..., Q, D) -> (..., P, Q) Euclidean distances, expanded form ‖a‖² + ‖b‖² − 2 a·b."""
    d2 = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1).unsqueeze(-2) - 2.0 * (a @ b.transpose(-1, -2))
    return d2.clamp_min(eps2).sqrt()


def self_distances(x: torch.Tensor, eps2: float = EPS2) -> torch.Tensor:
    """(..., P, D) -> (..., P, P) distances within a set, from one Gram matrix (norms on its diagonal)."""
    gram = x @ x.transpose(-1, -2)
    sq = gram.diagonal(dim1=-2, dim2=-1)
    return (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2.0 * gram).clamp_min(eps2).sqrt()


def paired_distances(a: torch.Tensor, b: torch.Tensor, eps2: float = EPS2) -> torch.Tensor:
    """Row-wise ‖a_i − b_i‖ for equally shaped (..., D) tensors (difference form: no cancellation)."""
    diff = a - b
    return (diff * diff).sum(-1).clamp_min(eps2).sqrt()


def search_rows(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(P, D) -> (P, D + 2) rows [−2a, ‖a‖², 1] in `dtype`: against `search_columns(b)` one GEMM gives ‖a − b‖²."""
    a = a.detach().float()
    return torch.cat([-2.0 * a, a.square().sum(1, keepdim=True), torch.ones_like(a[:, :1])], 1).to(dtype)


def search_columns(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(Q, D) -> (Q, D + 2) columns [b, 1, ‖b‖²] in `dtype` (see `search_rows`)."""
    b = b.detach().float()
    return torch.cat([b, torch.ones_like(b[:, :1]), b.square().sum(1, keepdim=True)], 1).to(dtype)


def squared_distance_estimates(rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """(P, Q) estimates of ‖a_i − b_j‖² from `search_rows(a)`, `search_columns(b)`: one GEMM, within
    `search_rounding_bound` of the truth."""
    with torch.no_grad():
        return rows @ columns.T


def search_rounding_bound(
    a_max_norm: float, b_max_norm: float, dim: int, dtype: torch.dtype, input_roundoff: float
) -> float:
    """Bound on |estimate − ‖a − b‖²| of `squared_distance_estimates` (rigorous, with a 1.5× margin).

    With the GEMM's inputs rounded to unit roundoff u (`search_precision.input_roundoff`), float32
    accumulation and the output stored in `dtype` (unit roundoff v), for ‖a‖ ≤ A, ‖b‖ ≤ B:
    rounding a and b moves 2·a·b by at most 2(2u + u²)AB (Cauchy–Schwarz); the norms, summed in
    float32 and rounded, by (u + D·ε₃₂)(A² + B²); accumulating D + 2 terms whose magnitudes sum to at
    most (A + B)²(1 + u)² adds (D + 2)·ε₃₂ times that; storing the result adds v·(A + B)²(1 + u)².
    """
    u, v, eps32 = input_roundoff, torch.finfo(dtype).eps / 2, torch.finfo(torch.float32).eps
    a, b = a_max_norm, b_max_norm
    spread = (a + b) ** 2 * (1 + u) ** 2
    error = 2 * (2 * u + u * u) * a * b + (u + dim * eps32) * (a * a + b * b) + ((dim + 2) * eps32 + v) * spread
    return 1.5 * error + 1e-12


def raised_threshold(threshold: float, dtype: torch.dtype) -> float:
    """`threshold` (> 0) raised so that a `<` comparison with a `dtype` tensor, which rounds it to `dtype`, can
    only widen."""
    return threshold * (1 + 2 * torch.finfo(dtype).eps)
