"""The GPU check's stack probe (benchmarks/gpu_check.sh): torch, CUDA, the arch list, bfloat16,
faiss and whether its GPU build loads, the other packages, the commit, and the node's facts as
`dmlrepro doctor` prints them (driver, GPUs, CPUs allowed). Usage: gpu_check_probe.py OUT.json"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from importlib import metadata


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _faiss() -> dict:
    try:
        import faiss
    except Exception as error:  # noqa: BLE001 - any import failure is the answer
        return {"import": f"failed: {error}"}
    gpus = getattr(faiss, "get_num_gpus", lambda: 0)()
    return {
        "import": "ok",
        "version": getattr(faiss, "__version__", None),
        "gpu_build": hasattr(faiss, "StandardGpuResources"),
        "gpus_seen": gpus,
    }


def probe() -> dict:
    import torch

    from dmlrepro.doctor import facts as doctor_facts
    from dmlrepro.train.runtime import cpu_model

    cuda = torch.cuda.is_available()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    return {
        "commit": commit,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cuda_available": cuda,
        "device_name": torch.cuda.get_device_name(0) if cuda else cpu_model(),
        "arch_list": torch.cuda.get_arch_list() if cuda else [],
        "bf16_supported": torch.cuda.is_bf16_supported() if cuda else None,
        "faiss": _faiss(),
        "node": doctor_facts(),
        "packages": {
            n: _version(n)
            for n in ("torchvision", "timm", "pytorch-metric-learning", "snakemake", "nvidia-dali-cuda130")
        },
    }


if __name__ == "__main__":
    facts = probe()
    with open(sys.argv[1], "w") as handle:
        json.dump(facts, handle, indent=1)
    print(json.dumps(facts, indent=1))
