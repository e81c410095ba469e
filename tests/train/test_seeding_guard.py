"""DeterminismGuard sets what torch.use_deterministic_algorithms sets, without importing the compiler stack."""

import subprocess
import sys

import torch

from dmlrepro.train.seeding import DeterminismGuard


def test_guard_sets_and_restores_the_deterministic_flags():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    with DeterminismGuard(True, None):
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    ) == before


def test_guard_does_not_import_inductor_and_sets_its_flag_where_loaded():
    code = (
        "import sys, torch\nfrom dmlrepro.train.seeding import DeterminismGuard\n"
        "with DeterminismGuard(True, None): pass\nprint('torch._inductor' in sys.modules)\n"
        "import torch._inductor.config as c\nwith DeterminismGuard(True, None): print(c.deterministic)\n"
        "print(c.deterministic)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "False"]
