"""``dmlrepro doctor``: this node's facts for training on it, on one screen: torch and the CUDA it was
built for, the NVIDIA driver against the one that CUDA needs, the GPUs torch sees, CUDA_VISIBLE_DEVICES
and the job's GPU request, the CPUs (model, vector units, the kernels' digest: cpu_isa.kernel_digest, the
ones this process may use, torch's threads) and faiss. Exit status 1 when the job asked for a GPU (``--require-gpu`` or
``DMLREPRO_GPUS`` > 0) and none is usable: the line a training run would stop with
(docs/environment.md#gpu-driver)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dmlrepro.cpu_isa import ENV as CPU_ISA_ENV, kernel_digest, requested_level

#: the CPU flags that decide the CPU kernels' speed (AVX2 / AVX-512 / AMX; bf16 units)
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
#: the scheduler's variables that say what the job was given
JOB_VARIABLES = ("CUDA_VISIBLE_DEVICES", "DMLREPRO_GPUS", "DMLREPRO_GPU_SLOT", "SLURM_JOB_ID", "SLURM_CPUS_PER_TASK")


def cpu_flags() -> list[str]:
    """Which of :data:`CPU_FLAGS` this CPU has (/proc/cpuinfo)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return [f for f in CPU_FLAGS if f in have]


def gpus() -> list[dict[str, Any]]:
    """The CUDA devices torch sees: name, compute capability, memory and uuid."""
    import torch  # noqa: PLC0415  (deferred: `dmlrepro --help` stays fast)

    out = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gb": round(props.total_memory / 2**30, 1),
                "uuid": str(props.uuid),
            }
        )
    return out


def facts() -> dict[str, Any]:
    """Everything the doctor prints, as a mapping (``--json``)."""
    import torch  # noqa: PLC0415

    from dmlrepro.preflight.node import faiss_facts  # noqa: PLC0415
    from dmlrepro.train.runtime import (  # noqa: PLC0415
        available_cpus,
        cpu_model,
        driver_version,
        gpu_unusable_reason,
        required_driver,
    )

    need = required_driver(torch.version.cuda)
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "driver": driver_version(),
        "driver_required": f">= {need}" if need else None,
        "gpus": gpus(),
        "gpu_unusable": gpu_unusable_reason(),
        "job": {name: os.environ.get(name) for name in JOB_VARIABLES},
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_isa": requested_level(),
        "kernel_digest": kernel_digest(),
        "cpus_usable": available_cpus(),
        "torch_threads": torch.get_num_threads(),
        "faiss": faiss_facts(torch.device("cpu")),
    }


def screen(f: dict[str, Any]) -> str:
    """The facts as the lines the doctor prints."""
    faiss = f["faiss"]
    lines = [
        f"torch       {f['torch']} (CUDA build: {f['torch_cuda'] or 'none, CPU only'})",
        f"driver      {f['driver'] or 'none'} (this torch needs {f['driver_required'] or 'no GPU driver'})",
        f"GPU         {'usable' if f['gpu_unusable'] is None else 'not usable: ' + f['gpu_unusable']}",
    ]
    lines += [
        f"  cuda:{g['index']}    {g['name']}, capability {g['capability']}, {g['memory_gb']} GB, {g['uuid']}"
        for g in f["gpus"]
    ]
    lines += [
        "job         "
        + (", ".join(f"{k}={v!r}" for k, v in f["job"].items() if v is not None) or "no scheduler variables"),
        f"CPU         {f['cpu']}; {', '.join(f['cpu_flags']) or 'no AVX2'}; torch kernels {f['cpu_capability']}"
        f" ({CPU_ISA_ENV}={f['cpu_isa']})",
        f"bits        kernel digest {f['kernel_digest']}: hosts with the same digest give a CPU run the same bits"
        " (docs/training.md#between-intel-and-amd)",
        f"CPUs        {f['cpus_usable']} usable by this process; torch threads {f['torch_threads']}",
        f"faiss       {faiss['faiss'] or 'not installed'}"
        + (f" (GPU build, {faiss['faiss_gpus']} GPU(s))" if faiss["faiss_gpu_build"] else " (CPU build)"),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dmlrepro doctor",
        description="Print this node's facts for training: torch, CUDA, driver, GPUs, CPUs, faiss.",
    )
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    parser.add_argument(
        "--require-gpu", action="store_true", help="exit 1 unless a GPU is usable (also when DMLREPRO_GPUS > 0)"
    )
    args = parser.parse_args(argv)
    from dmlrepro.train.runtime import gpus_requested  # noqa: PLC0415

    f = facts()
    print(json.dumps(f, indent=1) if args.json else screen(f))
    return int((args.require_gpu or gpus_requested() > 0) and f["gpu_unusable"] is not None)
