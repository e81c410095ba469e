"""One instruction set for torch's CPU kernels on every x86-64 host (dmlrepro.cpu_isa,
docs/training.md#bit-exactness): importing dmlrepro sets ATen's, oneDNN's and MKL's kernels to AVX2
(the variables and values of their documentation: ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2,
MKL_CBWR=AVX2,STRICT), so a training step gives the bits an AVX2-only host gives."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dmlrepro.cpu_isa import ENV, kernel_digest, pin_cpu_isa, requested_level
from dmlrepro.train.precision import precision_record

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2,STRICT"}

#: the kernels' digest (cpu_isa.kernel_digest: 10 Adam steps of a small conv net, its weights' and outputs' sha256) and
#: ATen's kernel level, importing dmlrepro before torch ("dmlrepro") or after torch ("torch": then not pinning)
TRAINING = textwrap.dedent(
    """
    import sys
    if sys.argv[1] == "dmlrepro":
        import dmlrepro
    import torch
    from dmlrepro.cpu_isa import kernel_digest
    print(kernel_digest(), torch.backends.cpu.get_cpu_capability())
    """
)

x86_64 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 kernels")


def _clean_env() -> dict[str, str]:
    """This process's environment without the three libraries' variables and DMLREPRO_CPU_ISA."""
    return {k: v for k, v in os.environ.items() if k not in AVX2 and k != ENV}


def _train(first: str, env: dict[str, str]) -> tuple[str, str]:
    """(weights digest, ATen's kernels) of TRAINING in a fresh interpreter with `env` and none of the
    variables set, importing dmlrepro before torch (`first` = "dmlrepro") or only after it, unpinned ("torch")."""
    env = {**_clean_env(), **({ENV: "native"} if first == "torch" else {}), **env}
    out = subprocess.run([sys.executable, "-c", TRAINING, first], env=env, capture_output=True, text=True, check=True)
    digest, kernels = out.stdout.split()
    return digest, kernels


@x86_64
def test_a_training_step_gives_an_avx2_hosts_bits_wherever_dmlrepro_is_imported():
    pinned = _train("dmlrepro", {})
    assert pinned == _train("torch", AVX2)  # the three libraries at AVX2, set before the process starts
    assert pinned[1] == "AVX2"
    native = _train("dmlrepro", {ENV: "native"})
    assert native == _train("torch", {})  # native: each library's own pick
    if native[1] != "AVX2":  # a host with wider kernels (AVX-512): the pick changes the bits
        assert native[0] != pinned[0]


@x86_64
def test_the_kernel_digest_changes_with_the_kernels():
    """SSE kernels in all three libraries (MKL's COMPATIBLE branch, oneMKL's branch for every x86 CPU) round
    otherwise than AVX2's: another digest, as `dmlrepro doctor` shows another host's."""
    sse = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE,STRICT"}
    assert _train("torch", sse)[0] != _train("dmlrepro", {})[0]


def test_the_kernel_digest_leaves_torchs_rng_and_threads_as_found():
    threads, state = torch.get_num_threads(), torch.random.get_rng_state()
    first = kernel_digest()
    assert torch.get_num_threads() == threads and torch.equal(torch.random.get_rng_state(), state)
    assert kernel_digest() == first and len(first) == 12


#: a linear layer's rows over a whole batch and over its first n rows
ROWS = textwrap.dedent(
    """
    import sys
    if sys.argv[1] == "dmlrepro":
        import dmlrepro
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layer, x = torch.nn.Linear(96, 64), torch.randn(300, 96)
    whole = layer(x)
    print(all(torch.equal(whole[:n], layer(x[:n])) for n in (1, 7, 37, 128, 299)))
    """
)


def _intel() -> bool:
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@x86_64
@pytest.mark.skipif(
    not _intel(),
    reason="oneMKL's strict AVX2 branch is Intel's only (its Developer Guide, Conditional Numerical Reproducibility); "
    "on an AMD EPYC products of 1-3 rows round otherwise (docs/training.md#between-intel-and-amd)",
)
def test_an_images_embedding_does_not_depend_on_its_batch():
    """MKL's strict mode: its AVX2 (and AVX-512) products round a row by the batch around it otherwise, and a
    run re-embedded from its checkpoint in other batches would change its metrics (docs/training.md)."""
    out = subprocess.run(
        [sys.executable, "-c", ROWS, "dmlrepro"], env=_clean_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["True"]


def test_the_pin_sets_the_three_libraries_where_unset_and_keeps_what_is_set():
    environ: dict[str, str] = {}
    assert pin_cpu_isa(environ, machine="x86_64") == AVX2 and environ == AVX2
    environ = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    assert pin_cpu_isa(environ, machine="x86_64") == {k: v for k, v in AVX2.items() if k != "ONEDNN_MAX_CPU_ISA"}
    assert environ["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"


def test_native_and_other_machines_set_nothing():
    environ = {ENV: "native"}
    assert pin_cpu_isa(environ, machine="x86_64") == {} and environ == {ENV: "native"}
    environ = {}
    assert pin_cpu_isa(environ, machine="aarch64") == {} and environ == {}


def test_an_unknown_level_is_refused_in_one_line():
    assert requested_level({ENV: " AVX2 "}) == "avx2" and requested_level({}) == "avx2"
    with pytest.raises(ValueError, match=r"DMLREPRO_CPU_ISA='avx512': expected one of avx2, native"):
        requested_level({ENV: "avx512"})


@x86_64
def test_metrics_json_records_the_kernels_a_cpu_run_used():
    record = precision_record(None, torch.device("cpu"), False, None)
    assert record["cpu_isa"] == requested_level()
    assert record["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert record["onednn_max_cpu_isa"] == os.environ.get("ONEDNN_MAX_CPU_ISA")
    assert record["mkl_cbwr"] == os.environ.get("MKL_CBWR")
    assert record["kernel_digest"] == kernel_digest()  # the report tells hosts apart by it


def test_a_cuda_runs_record_has_no_kernel_digest(monkeypatch):
    """A GPU run's bits are its GPU's: the CPU kernels' digest is not computed for it (the report names the GPU)."""
    import dmlrepro.train.precision as precision

    monkeypatch.setattr(precision, "device_identity", lambda device: {"device_name": "NVIDIA H200"})
    monkeypatch.setattr(precision, "kernel_digest", lambda: pytest.fail("a CUDA run computed the CPU's digest"))
    assert precision.precision_record(None, torch.device("cuda", 0), False, None)["kernel_digest"] is None
