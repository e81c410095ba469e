"""Facts about the node a preflight runs on: the device, torch and CUDA, bfloat16, the faiss build
and whether a faiss search on the GPU works there, and the CPUs this process may use."""

from __future__ import annotations

import platform
from typing import Any

import torch

from dmlrepro.evaluation.knn import faiss_gpu_usable
from dmlrepro.train.runtime import available_cpus


def node_facts(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "host": platform.node(),
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": available_cpus(),
    }
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        facts.update(
            name=torch.cuda.get_device_name(index),
            capability=f"{major}.{minor}",
            memory_gb=round(torch.cuda.get_device_properties(index).total_memory / 2**30, 1),
            bf16=bool(torch.cuda.is_bf16_supported()),
        )
    else:
        facts.update(name=platform.processor() or platform.machine(), capability=None, memory_gb=None, bf16=cpu_bf16())
    facts.update(faiss_facts(device))
    return facts


def cpu_bf16() -> bool:
    """Whether a bfloat16 autocast matmul runs on this CPU."""
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = torch.ones(4, 4) @ torch.ones(4, 4)
        return out.dtype == torch.bfloat16
    except RuntimeError:
        return False


def faiss_facts(device: torch.device) -> dict[str, Any]:
    """faiss version, whether the build has GPU support, GPUs it sees, and whether a search on the
    device's GPU works (probed in a subprocess; None on the CPU)."""
    try:
        import faiss  # deferred: faiss is an optional extra
    except ImportError:
        return {"faiss": None, "faiss_gpu_build": False, "faiss_gpus": 0, "faiss_gpu_search": None}
    gpu_build = hasattr(faiss, "StandardGpuResources")
    gpus = int(faiss.get_num_gpus()) if gpu_build else 0
    search = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        search = gpus > index and faiss_gpu_usable(index)
    return {
        "faiss": getattr(faiss, "__version__", "unknown"),
        "faiss_gpu_build": gpu_build,
        "faiss_gpus": gpus,
        "faiss_gpu_search": search,
    }
