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


# -- the CUDA lane ---------------------------------------------------------------------------------
#: the device of the `cuda`-marked tests: "cuda", or "cpu" to check the lane's own logic without a GPU
LANE_DEVICE = os.environ.get("DMLREPRO_CUDA_LANE_DEVICE", "cuda")


@pytest.fixture
def lane_device() -> str:
    """The device a `cuda`-marked test runs on; skipped where no GPU is visible (CI has none).
    `DMLREPRO_CUDA_LANE_DEVICE=cpu` runs the lane on the CPU (docs/testing.md#the-cuda-lane)."""
    if LANE_DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible: the CUDA lane runs on a GPU node (benchmarks/gpu_check.sh)")
    return LANE_DEVICE


# -- required integration checks --------------------------------------------------------------------
class MissingComponent(pytest.fail.Exception):
    """A real component an integration test needs (SLURM, Chromium) is missing under CI=true."""


#: values of CI that say "not CI" (any other non-empty value is CI: true, 1, True, woodpecker, ...)
NOT_CI = {"", "0", "false", "no", "off"}


def in_ci() -> bool:
    """CI sets CI (GitHub, GitLab, Travis, CircleCI, Buildkite: true; AppVeyor: True; Woodpecker:
    woodpecker; by hand often 1): there every integration check is required."""
    return os.environ.get("CI", "").strip().lower() not in NOT_CI


def require(problem: str | None) -> None:
    """An integration test's precondition: `problem` None (the component is there) lets it run;
    otherwise the test fails with `problem` under CI=true (CI sets the component up, so it must run)
    and is skipped with `problem` elsewhere. Call it first in the test or its fixture."""
    if problem is None:
        return
    if in_ci():
        raise MissingComponent(
            f"CI={os.environ['CI']} and a required integration check cannot run: {problem}", pytrace=False
        )
    pytest.skip(problem)


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium of the report's browser checks (dmlrepro.report.browser): a required integration
    check (`require`); ask for it before any costly fixture, so a missing browser stops the test first."""
    from dmlrepro.report.browser import find_chromium

    found = find_chromium()
    require(
        None if found else "chromium is not on PATH (.ci/install-chromium installs it): the browser check cannot run"
    )
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """`require` failing in a fixture is the test's failure, not a fixture error."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "setup" and call.excinfo is not None and call.excinfo.errisinstance(MissingComponent):
        report.when = "call"


# -- parallel runs (pytest-xdist: `pytest -n auto`, docs/testing.md#parallel-runs) -------------------
def xdist_scope(nodeid: str) -> str:
    """The unit a worker takes whole: the test's module (its module fixtures then run once), or
    "slurm" for every test file named *slurm* (they share the one-node cluster: one after another)."""
    module = nodeid.split("::", 1)[0]
    return "slurm" if "slurm" in module.rsplit("/", 1)[-1] else module


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown where it is not installed
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduler with :func:`xdist_scope` (its `--dist loadgroup` marks do not reach the
    scheduler under pytest 9.2: pytest-xdist issue #1386)."""
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 (only under -n)

    class ModulesAndCluster(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ModulesAndCluster(config, log)


def state_differences(a: dict, b: dict) -> list[str]:
    """The keys of two state dicts (a checkpoint's model or loss) whose values differ: tensors compared
    exactly, anything else (a module's extra state, e.g. PFML's pair paths taken) by equality."""
    if a.keys() != b.keys():
        return sorted(set(a) ^ set(b))
    return [k for k, v in a.items() if not (torch.equal(v, b[k]) if torch.is_tensor(v) else v == b[k])]
