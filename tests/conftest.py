"""Fixtures shared by the test folders, and `require` for the integration checks."""

import os

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


# -- required integration checks --------------------------------------------------------------------
class MissingComponent(pytest.fail.Exception):
    """A real component an integration test needs (SLURM, Chromium) is missing under CI=true."""


def in_ci() -> bool:
    """CI sets CI=true: there every integration check is required."""
    return os.environ.get("CI", "").strip().lower() == "true"


def require(problem: str | None) -> None:
    """An integration test's precondition: `problem` None (the component is there) lets it run;
    otherwise the test fails with `problem` under CI=true (CI sets the component up, so it must run)
    and is skipped with `problem` elsewhere. Call it first in the test or its fixture."""
    if problem is None:
        return
    if in_ci():
        raise MissingComponent(f"CI=true and a required integration check cannot run: {problem}", pytrace=False)
    pytest.skip(problem)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """`require` failing in a fixture is the test's failure, not a fixture error."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "setup" and call.excinfo is not None and call.excinfo.errisinstance(MissingComponent):
        report.when = "call"
