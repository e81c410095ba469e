"""Matrix products in IEEE float32 (TF32 off) for a block of code: the k-NN searches that feed a metric or a
selection (docs/evaluation.md) and the losses' distances (docs/losses.md) then give the same numbers on every
device, whatever a run's ``speed.tf32`` turns on for training."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """TF32 off inside, the previous setting restored after. Set through the API that set it: the CUDA flag
    ``torch.backends.cuda.matmul.allow_tf32`` (the engine's), or ``torch.set_float32_matmul_precision`` where a
    caller lowered it (torch refuses to read one API after the other was used)."""
    matmul = torch.backends.cuda.matmul
    lowered = getattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision", "none") not in ("none", "ieee")
    prev = torch.get_float32_matmul_precision() if lowered else matmul.allow_tf32
    if lowered:
        torch.set_float32_matmul_precision("highest")
    else:
        matmul.allow_tf32 = False
    try:
        yield
    finally:
        if lowered:
            torch.set_float32_matmul_precision(prev)
        else:
            matmul.allow_tf32 = prev
