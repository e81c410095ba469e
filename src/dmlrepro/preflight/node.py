"""Facts about the node a preflight runs on: the device, torch and CUDA, bfloat16, the faiss build
and whether a faiss search on the GPU works there, and the CPUs this process may use."""

from __future__ import annotations

import platform
import subprocess
import sys
from typing import Any

import torch

#: a faiss search on one GPU in a separate process (an architecture without kernels in the faiss
#: build aborts that process, not the preflight)
_FAISS_PROBE = """
import sys
import numpy as np
import faiss
res = faiss.StandardGpuResources()
index = faiss.index_cpu_to_gpu(res, int(sys.argv[1]), faiss.IndexFlatL2(8))
x = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
index.add(x)
_, ids = index.search(x, 1)
assert (ids[:, 0] == np.arange(64)).all()
print("ok")
"""


def node_facts(device: torch.device) -> dict[str, Any]:
    from dmlrepro.train.runtime import available_cpus

    facts: dict[str, Any] = {"host": platform.node(), "device": str(device), "torch": torch.__version__,
                             "cuda": torch.version.cuda, "cpus": available_cpus()}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        facts.update(name=torch.cuda.get_device_name(index), capability=f"{major}.{minor}",
                     memory_gb=round(torch.cuda.get_device_properties(index).total_memory / 2**30, 1),
                     bf16=bool(torch.cuda.is_bf16_supported()))
    else:
        facts.update(name=platform.processor() or platform.machine(), capability=None, memory_gb=None,
                     bf16=cpu_bf16())
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
        import faiss
    except ImportError:
        return {"faiss": None, "faiss_gpu_build": False, "faiss_gpus": 0, "faiss_gpu_search": None}
    gpu_build = hasattr(faiss, "StandardGpuResources")
    gpus = int(faiss.get_num_gpus()) if gpu_build else 0
    search = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        search = gpus > index and faiss_gpu_search_works(index)
    return {"faiss": getattr(faiss, "__version__", "unknown"), "faiss_gpu_build": gpu_build, "faiss_gpus": gpus,
            "faiss_gpu_search": search}


def faiss_gpu_search_works(gpu: int) -> bool:
    """The evaluation's own probe (dmlrepro.evaluation.knn) where it has one, else this module's."""
    try:
        from dmlrepro.evaluation.knn import faiss_gpu_usable
    except ImportError:
        faiss_gpu_usable = None
    if faiss_gpu_usable is not None:
        return bool(faiss_gpu_usable(gpu))
    try:
        done = subprocess.run([sys.executable, "-c", _FAISS_PROBE, str(gpu)], capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip().endswith("ok")
