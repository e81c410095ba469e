"""Euclidean distances with finite gradients everywhere, and a conservative near-pair search.

Distances for the losses clamp the squared distance *before* the square root (docs/readings/pfml.md#pfml-r7,
the RSW code's Model.py): at coincident points the clamp's gradient is 0, so the finite derivative of sqrt at
`eps2` is multiplied by 0 and no NaN appears.

Near-pair searches only decide which pairs enter an exact evaluation, so they run as one low
precision GEMM (bfloat16 by default: about 6× faster than float32 on CPUs with AVX-512 BF16) with
the squared radius widened by a rigorous rounding bound: rounding can add candidates, never drop one.
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


def lowp_rounding_bound(a_max_norm: float, b_max_norm: float, dim: int, dtype: torch.dtype) -> float:
    """Bound on the error of ‖b‖² − 2·a·b from `shifted_cross_lowp` (rigorous, with margin).

    With unit roundoff u of `dtype`, rounding a and b changes a·b by at most (2u + u²)‖a‖‖b‖
    (Cauchy–Schwarz); float32 accumulation adds at most D·ε₃₂‖a‖‖b‖; rounding ‖b‖² and the output
    (|‖b‖² − 2a·b| ≤ (‖a‖ + ‖b‖)²) adds at most u·‖b‖² + u·(‖a‖ + ‖b‖)².
    """
    u, eps32 = torch.finfo(dtype).eps / 2, torch.finfo(torch.float32).eps
    a, b = a_max_norm, b_max_norm
    return 1.5 * (2 * (2 * u + u * u + dim * eps32) * a * b + u * b * b + u * (a + b) ** 2) + 1e-12


def lowp_threshold(threshold: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`threshold` in `dtype`, raised first so that rounding can only widen a `<` comparison."""
    u = torch.finfo(dtype).eps / 2
    return (threshold + 2 * u * threshold.abs()).to(dtype)


def shifted_cross_lowp(a: torch.Tensor, b: torch.Tensor, b_sq_norms: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(P, D), (Q, D) -> (P, Q) ‖b_j‖² − 2·a_i·b_j in `dtype`, one GEMM with a fused epilogue.

    Adding ‖a_i‖² gives the squared distance; a search compares against a per-row threshold instead,
    so the (P, Q) matrix is touched only by the comparison.
    """
    with torch.no_grad():
        return torch.addmm(b_sq_norms.to(dtype)[None, :], a.to(dtype), b.to(dtype).T, alpha=-2.0)
