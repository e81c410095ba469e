"""The instruction set torch's CPU kernels use: one level on every x86-64 host, so that a CPU run's
numbers do not depend on which Intel machine ran it (docs/training.md#bit-exactness; an AMD host rounds
otherwise whatever the level: docs/training.md#between-intel-and-amd, :func:`kernel_digest` tells hosts apart).

torch picks its CPU kernels by the host's instruction set in three libraries, and each pick changes
the float rounding, which training amplifies into different weights: ATen's vectorised kernels
(``ATEN_CPU_CAPABILITY``), oneDNN's convolutions (``ONEDNN_MAX_CPU_ISA``) and MKL's BLAS
(``MKL_CBWR``, MKL's conditional numerical reproducibility). Importing dmlrepro sets all three to
AVX2, which every x86-64 server of the last decade has, MKL in its strict mode (otherwise its
products round a row by the rows around it: an image's embedding would depend on its batch), unless
``DMLREPRO_CPU_ISA=native`` (each library's own pick: the fastest kernels, numbers that depend on the
host) or the variable is set already. The libraries read them at their first use, so the pin acts
only where dmlrepro is imported before torch's first operation; :func:`cpu_isa_record` says what
took effect.
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping
from typing import Any

__all__ = ["ENV", "LEVELS", "DEFAULT_LEVEL", "requested_level", "pin_cpu_isa", "cpu_isa_record", "kernel_digest"]

ENV = "DMLREPRO_CPU_ISA"
#: each level's settings of the three libraries (``native``: none, each library picks for the host)
LEVELS: dict[str, dict[str, str]] = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2,STRICT"},
    "native": {},
}
DEFAULT_LEVEL = "avx2"
#: the machines whose kernels the levels name
X86_64 = ("x86_64", "amd64")


def requested_level(environ: MutableMapping[str, str] = os.environ) -> str:
    """The level ``DMLREPRO_CPU_ISA`` asks for (unset or empty: ``avx2``); ValueError on another value."""
    level = environ.get(ENV, "").strip().lower() or DEFAULT_LEVEL
    if level not in LEVELS:
        raise ValueError(f"{ENV}={environ[ENV]!r}: expected one of {', '.join(LEVELS)} (docs/environment.md)")
    return level


def pin_cpu_isa(environ: MutableMapping[str, str] = os.environ, machine: str | None = None) -> dict[str, str]:
    """Set the requested level's variables in `environ` where they are not set (x86-64 only: elsewhere
    the levels name no kernels); returns what it set."""
    if (machine or platform.machine()).lower() not in X86_64:
        return {}
    missing = {key: value for key, value in LEVELS[requested_level(environ)].items() if key not in environ}
    environ.update(missing)
    return missing


def cpu_isa_record() -> dict[str, Any]:
    """What metrics.json says the CPU kernels were: the level asked for, ATen's kernels as torch chose
    them (``AVX2``, ``AVX512``, ...) and the oneDNN and MKL settings the process ran with."""
    import torch  # deferred: dmlrepro imports without torch

    return {
        "cpu_isa": requested_level(),
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
    }


def kernel_digest() -> str:
    """A digest of the bits this host's CPU kernels give: 10 Adam steps of a small conv net (oneDNN's
    convolutions, MKL's linear layer, ATen's reductions) on one thread from seed 0, then its outputs for the
    whole batch and for its first one, two and three images; sha256 of the weights' and outputs' bytes, 12 hex
    digits. Two hosts with the same digest round as one. The pin equalises Intel hosts, whose products do not
    depend on the batch; an AMD EPYC's one-image product differs from its whole-batch one, so its digest
    differs from every such host's (docs/training.md#between-intel-and-amd). About 0.05 s once torch's
    optimisers are imported (1.4 s before). Leaves torch's RNG and threads as found."""
    import hashlib

    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            nn = torch.nn
            net = nn.Sequential(
                nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
            )  # fmt: skip
            opt = torch.optim.Adam(net.parameters(), 1e-2)
            x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))
            for _ in range(10):
                loss = nn.functional.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            net.eval()
            with torch.no_grad():
                outputs = [net(x[:n]) for n in (len(x), 1, 2, 3)]
    finally:
        torch.set_num_threads(threads)
    digest = hashlib.sha256()
    for tensor in [*net.parameters(), *outputs]:
        digest.update(tensor.detach().numpy().tobytes())
    return digest.hexdigest()[:12]
