"""The precision of the near-pair searches' GEMM on a device, and the unit roundoff of its inputs.

The searches (`distances.py`) only pick candidates for an exact evaluation, with the squared radius
widened by a rounding bound for the GEMM's precision, so every precision yields the same pairs and
the choice is one of speed (docs/losses.md#search-precision):

* x86 CPU with AVX-512 BF16 or AMX: bfloat16, which those units multiply natively;
* any other CPU: float32 (without bfloat16 units a bfloat16 GEMM is emulated, several times slower);
* CUDA and other accelerators: float32. cuBLAS may reduce bfloat16 GEMMs in reduced precision
  (`torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction`, on by default), which no
  input-rounding bound covers; a float32 GEMM accumulates in float32, and where TF32 is allowed its
  inputs are rounded to TF32, which `input_roundoff` accounts for.

The CPU probe reads the instruction-set flags once per process.
"""

from __future__ import annotations

import functools
import platform

import torch

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo names of native bfloat16 dot products
TF32_ROUNDOFF = 2.0**-11  # TensorFloat32 keeps 10 explicit mantissa bits
BF16_ROUNDOFF = 2.0**-8


def search_dtype_for(device_type: str, cpu_bf16_native: bool) -> torch.dtype:
    """bfloat16 only on a CPU that multiplies it natively, float32 everywhere else (module docstring)."""
    return torch.bfloat16 if device_type == "cpu" and cpu_bf16_native else torch.float32


@functools.cache
def cpu_has_native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 dot-product instructions (AVX-512 BF16 or AMX), probed once."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if all(callable(probe) for probe in probes):
        return any(probe() for probe in probes)
    return bool(set(BF16_CPU_FLAGS) & cpu_flags())


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags from /proc/cpuinfo (empty where there is none)."""
    if platform.system() != "Linux":
        return set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def search_dtype_on(device: torch.device) -> torch.dtype:
    """The near-pair search GEMM's dtype on `device`."""
    return search_dtype_for(device.type, device.type == "cpu" and cpu_has_native_bfloat16())


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
