"""Fixtures shared by the test folders."""

import pytest
import torch


@pytest.fixture
def float64_default():
    """float64 tensors inside one test (a module-level default would leak into other tests); a module
    opts in with `pytestmark = pytest.mark.usefixtures("float64_default")`."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)
