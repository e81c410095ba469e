"""The run's two precisions: training may autocast (``amp.*``), evaluation never does.

Training: float32 by default (``amp.enabled: false``); ``auto`` autocasts on CUDA only, ``true`` on
either device, in ``amp.dtype`` (float16 with a GradScaler). Every embedding that feeds a metric, a model
selection, a proxy selection or a report is computed by :func:`float32_inference`: autocast off
and TF32 off, so the stored embeddings carry float32's 24-bit mantissa on every device and a
re-evaluation through another path gives the same numbers (docs/readings/protocols.md#proto-r9).
Their k-NN searches run in float32 too (:func:`dmlrepro.evaluation.knn.exact_float32`);
:func:`precision_record` is what metrics.json says ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from dmlrepro.cpu_isa import cpu_isa_record, kernel_digest
from dmlrepro.evaluation.knn import SEARCH_PRECISION

from .runtime import device_identity

#: what metrics.json and the report say a run was evaluated in
EVAL_PRECISION = "float32"


def training_amp_dtype(cfg: dict[str, Any], device: torch.device) -> torch.dtype | None:
    """The autocast dtype a run trains in on `device` (None: float32)."""
    enabled = cfg["amp"]["enabled"]
    if (enabled == "auto" and device.type == "cuda") or enabled is True:
        return getattr(torch, cfg["amp"]["dtype"])
    return None


def precision_name(amp_dtype: torch.dtype | None, device: torch.device, tf32: bool = False) -> str:
    """How a run trained, in words: ``float32``, ``float32 (TF32 matmuls)``, ``bfloat16 autocast``,
    ``float16 autocast + GradScaler``."""
    if amp_dtype == torch.float16:
        return "float16 autocast + GradScaler"
    if amp_dtype is not None:
        return f"{str(amp_dtype).removeprefix('torch.')} autocast"
    return "float32 (TF32 matmuls)" if tf32 and device.type == "cuda" else "float32"


@contextlib.contextmanager
def float32_inference(device: torch.device) -> Iterator[None]:
    """Forward passes in true float32 on `device`: no autocast, no TF32 in matmuls or cuDNN
    convolutions (restored afterwards), no gradients."""
    matmul = torch.backends.cuda.matmul
    prev = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            yield
    finally:
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def precision_record(amp_dtype: torch.dtype | None, device: torch.device, tf32: bool, loss: Any) -> dict[str, Any]:
    """metrics.json's ``precision``: the device and the hardware behind it (:func:`device_identity`), the
    training, evaluation and k-NN search precisions, torch's TF32 flags as training ran (they act on CUDA
    only), the CPU kernels' instruction set (:func:`~dmlrepro.cpu_isa.cpu_isa_record`: CUDA runs' data
    pipeline and evaluation run some), for a CPU run the digest of the bits its host's kernels give
    (:func:`~dmlrepro.cpu_isa.kernel_digest`: the report flags a table mixing hosts that round otherwise) and,
    for a loss that says so, the pair search it took (PFML: ``pair_search_path``)."""
    return {
        "device": str(device),
        "train": precision_name(amp_dtype, device, tf32),
        "eval": EVAL_PRECISION,
        "search": SEARCH_PRECISION,
        "matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
        **device_identity(device),
        **cpu_isa_record(),
        "kernel_digest": kernel_digest() if device.type == "cpu" else None,
        "pair_search_path": getattr(loss, "pair_search_path", None),
    }
