"""Euclidean distances with finite gradients everywhere, and a conservative near-pair search.

Distances for the losses clamp the squared distance *before* the square root (docs/readings/pfml.md#pfml-r7,
the RSW code's Model.py): at coincident points the clamp's gradient is 0, so the finite derivative of sqrt at
`eps2` is multiplied by 0 and no NaN appears.

The distances' matrix products run in full float32 (TF32 off, backward included): the dense path gives the
same numbers on every GPU, and the same as the near-pair path up to float32 rounding.

Near-pair searches only decide which pairs enter an exact evaluation, so they run as one GEMM in the
search precision (`search_precision.py`) that returns, for each pair, ‖a − b‖² minus a rigorous bound
on that pair's rounding error (from its own two norms): rounding can add candidates, never drop one.
"""

from __future__ import annotations

import dataclasses

import torch

from dmlrepro.ieee_float32 import exact_float32

EPS2 = 1e-12


class _Float32Product(torch.autograd.Function):
    """a @ bᵀ, forward and backward under `exact_float32` (its gradients are products of the same kind)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        with exact_float32():
            return a @ b.transpose(-1, -2)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return float32_product(grad, b.transpose(-1, -2)), float32_product(grad.transpose(-1, -2), a.transpose(-1, -2))


def float32_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., P, D), (..., Q, D) -> (..., P, Q) = a @ bᵀ in full float32 on every device, gradients included."""
    return _Float32Product.apply(a, b)


def pairwise_distances(a: torch.Tensor, b: torch.Tensor, eps2: float = EPS2) -> torch.Tensor:
    """(..., P, D), (..., Q, D) -> (..., P, Q) Euclidean distances, expanded form ‖a‖² + ‖b‖² − 2 a·b."""
    d2 = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1).unsqueeze(-2) - 2.0 * float32_product(a, b)
    return d2.clamp_min(eps2).sqrt()


def self_distances(x: torch.Tensor, eps2: float = EPS2) -> torch.Tensor:
    """(..., P, D) -> (..., P, P) distances within a set, from one Gram matrix (norms on its diagonal)."""
    gram = float32_product(x, x)
    sq = gram.diagonal(dim1=-2, dim2=-1)
    return (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2.0 * gram).clamp_min(eps2).sqrt()


def paired_distances(a: torch.Tensor, b: torch.Tensor, eps2: float = EPS2) -> torch.Tensor:
    """Row-wise ‖a_i − b_i‖ for equally shaped (..., D) tensors (difference form: no cancellation)."""
    diff = a - b
    return (diff * diff).sum(-1).clamp_min(eps2).sqrt()


@dataclasses.dataclass(frozen=True)
class SearchBound:
    """How far a search GEMM may err, folded into it so that it returns lower bounds on ‖a − b‖².

    For ‖a‖ = A, ‖b‖ = B the GEMM's error is at most k_sq·(A² + B²) + k_x·A·B (`search_bound`); rows
    and columns carry −k_sq·A², −k_x·A and B, so the product is ‖a − b‖² minus that pair's own bound:
    a bound from the pair's norms, not from the largest norm of all rows. The result is stored in
    `dtype` (unit roundoff `output_roundoff`, relative to the stored value, which near the cut-off is
    the cut-off itself)."""

    k_sq: float
    k_x: float
    dtype: torch.dtype
    output_roundoff: float

    def threshold(self, squared_radius: float) -> float:
        """Compare the stored lower bounds with `<` against this to keep every pair with ‖a − b‖² < squared_radius."""
        return raised_threshold(squared_radius * (1 + self.output_roundoff), self.dtype)

    def distance_lower_bound(self, stored: torch.Tensor) -> torch.Tensor:
        """A lower bound on ‖a − b‖ from a stored lower bound on ‖a − b‖² (its output rounding undone)."""
        return (stored.float().clamp_min(0) / (1 + self.output_roundoff)).sqrt()


def search_bound(dim: int, dtype: torch.dtype, input_roundoff: float) -> SearchBound:
    """The error bound of the search GEMM (rigorous, with a 1.5× margin), as coefficients of A² + B² and A·B.

    With the GEMM's inputs rounded to unit roundoff u (`search_precision.input_roundoff`) and float32
    accumulation (ε₃₂): rounding a and b moves 2·a·b by at most 2(2u + u²)AB (Cauchy–Schwarz); the
    norms, summed in float32, scaled and rounded, by (u + (D + 1)·ε₃₂)(A² + B²); accumulating the
    D + 3 terms, whose magnitudes sum to at most (A + B)²(1 + u)²(1 + k) with k = k_sq + k_x ≤ 0.1,
    adds (D + 3)·ε₃₂ times that. The folded terms' own rounding, 2(u + ε₃₂) of them, lies within
    the margin. The output's rounding (relative) is handled by `SearchBound.threshold` and
    `distance_lower_bound`."""
    u, eps32 = input_roundoff, torch.finfo(torch.float32).eps
    accumulation = (dim + 3) * eps32 * (1 + u) ** 2 * 1.1
    k_sq = 1.5 * (u + (dim + 1) * eps32 + accumulation)
    k_x = 1.5 * (2 * (2 * u + u * u) + 2 * accumulation)
    if k_sq + k_x > 0.1:
        raise ValueError(f"search_bound: inputs with unit roundoff {u} in {dim} dimensions are too coarse to search")
    return SearchBound(k_sq, k_x, dtype, torch.finfo(dtype).eps / 2)


def search_rows(a: torch.Tensor, bound: SearchBound) -> torch.Tensor:
    """(P, D) -> (P, D + 3) rows [−2a, (1 − k_sq)‖a‖², 1, −k_x‖a‖]: against `search_columns(b)` one GEMM gives
    ‖a − b‖² minus the pair's error bound (`SearchBound`)."""
    a = a.detach().float()
    sq = a.square().sum(1, keepdim=True)
    return torch.cat([-2.0 * a, (1 - bound.k_sq) * sq, torch.ones_like(sq), -bound.k_x * sq.sqrt()], 1).to(bound.dtype)


def search_columns(b: torch.Tensor, bound: SearchBound) -> torch.Tensor:
    """(Q, D) -> (Q, D + 3) columns [b, 1, (1 − k_sq)‖b‖², ‖b‖] (see `search_rows`)."""
    b = b.detach().float()
    sq = b.square().sum(1, keepdim=True)
    return torch.cat([b, torch.ones_like(sq), (1 - bound.k_sq) * sq, sq.sqrt()], 1).to(bound.dtype)


def squared_distance_lower_bounds(rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """(P, Q) lower bounds on ‖a_i − b_j‖² from `search_rows(a)`, `search_columns(b)`: one GEMM, each within
    twice its pair's error bound of the truth (before the output's rounding)."""
    with torch.no_grad():
        return rows @ columns.T


def raised_threshold(threshold: float, dtype: torch.dtype) -> float:
    """`threshold` (> 0) raised so that a `<` comparison with a `dtype` tensor, which rounds it to `dtype`, can
    only widen."""
    return threshold * (1 + 2 * torch.finfo(dtype).eps)
