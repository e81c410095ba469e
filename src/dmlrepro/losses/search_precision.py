"""The precision of the near-pair searches' GEMM on a device, and the unit roundoff of its inputs.

The searches (`distances.py`) only pick candidates for an exact evaluation: each pair's result is a
lower bound on its squared distance, from a rounding bound on its own two norms, so every precision
yields the same loss to the bit and the choice is one of speed (docs/losses.md#search-precision):

* CPU: bfloat16 only where a search chunk in bfloat16 (GEMM, comparison, minima) is measured at
  least BFLOAT16_SPEEDUP times faster than in float32, once per process; float32 elsewhere. Not by
  the instruction-set flags: a bfloat16 search is wider (its bound, ~100x float32's, lets in more
  candidates and lowers the gaps, so more rows fall due), and the GEMM alone says nothing of that;
  the margin is what the end-to-end measurement asks
  (docs/benchmarks.md#pfml-search-precision-on-a-cpu-with-bfloat16-units).
* CUDA and other accelerators: float32. cuBLAS may reduce bfloat16 GEMMs in reduced precision
  (`torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction`, on by default), which no
  input-rounding bound covers; a float32 GEMM accumulates in float32, and where TF32 is allowed its
  inputs are rounded to TF32, which `input_roundoff` accounts for.
"""

from __future__ import annotations

import functools
import time

import torch

TF32_ROUNDOFF = 2.0**-11  # TensorFloat32 keeps 10 explicit mantissa bits
BF16_ROUNDOFF = 2.0**-8
BFLOAT16_SPEEDUP = 1.25  # a bfloat16 search chunk must be this much faster than float32's to be chosen
PROBE_SHAPE = (256, 4096, 514)  # rows, columns, D + 3 of the measured chunk (PFML at D = 512)


def search_dtype_for(device_type: str, cpu_speedup: float | None) -> torch.dtype:
    """bfloat16 only on a CPU where it was measured BFLOAT16_SPEEDUP times faster, float32 everywhere else."""
    use_bfloat16 = device_type == "cpu" and cpu_speedup is not None and cpu_speedup >= BFLOAT16_SPEEDUP
    return torch.bfloat16 if use_bfloat16 else torch.float32


@functools.cache
def cpu_bfloat16_speedup() -> float:
    """float32's time over bfloat16's for one search chunk on this CPU (best of three each, interleaved), once."""
    g = torch.Generator().manual_seed(0)
    rows, columns, dim = PROBE_SHAPE
    a, b = torch.randn(rows, dim, generator=g), torch.randn(columns, dim, generator=g)
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    for _ in range(3):
        for dtype in best:
            x, y = a.to(dtype), b.to(dtype)
            start = time.perf_counter()
            with torch.no_grad():
                product = x @ y.T
                (product < 0.5).any(), product.amin(1), product.amin(0)
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def search_dtype_on(device: torch.device) -> torch.dtype:
    """The near-pair search GEMM's dtype on `device`."""
    return search_dtype_for(device.type, cpu_bfloat16_speedup() if device.type == "cpu" else None)


def float32_matmul_roundoff(settings) -> float:
    """Unit roundoff of a float32 GEMM's inputs under torch's float32 matmul settings (conservative).

    "highest"/"ieee"/"none" keep float32; "high"/"tf32" may round the inputs to TF32 (or split each into
    two bfloat16s, which is finer); "medium"/"bf16" may round them to bfloat16."""
    settings = set(settings)
    if settings & {"medium", "bf16"}:
        return BF16_ROUNDOFF
    if settings & {"high", "tf32"}:
        return TF32_ROUNDOFF
    return torch.finfo(torch.float32).eps / 2


def float32_matmul_settings(device_type: str) -> list[str]:
    """The float32 matmul precision settings in force for `device_type` (legacy and per-backend flags)."""
    settings = [torch.get_float32_matmul_precision()]
    if device_type == "cuda":
        matmul = torch.backends.cuda.matmul
        settings += ["tf32" if matmul.allow_tf32 else "ieee", str(getattr(matmul, "fp32_precision", "none"))]
    elif device_type == "cpu" and hasattr(torch.backends.mkldnn, "matmul"):
        settings.append(str(getattr(torch.backends.mkldnn.matmul, "fp32_precision", "none")))
    return settings


def input_roundoff(dtype: torch.dtype, device: torch.device) -> float:
    """Unit roundoff of the search GEMM's inputs: the dtype's, or coarser for float32 under reduced matmul precision."""
    if dtype != torch.float32:
        return torch.finfo(dtype).eps / 2
    return float32_matmul_roundoff(float32_matmul_settings(device.type))
