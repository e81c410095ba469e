"""`pytest -n auto` (docs/testing.md#parallel-runs): which tests a worker takes together."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _conftest():
    spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_module_is_one_scope_and_every_slurm_file_shares_one():
    scope = _conftest().xdist_scope
    assert scope("tests/train/test_resume.py::test_a[1]") == scope("tests/train/test_resume.py::test_b")
    assert scope("tests/train/test_resume.py::test_a") != scope("tests/train/test_optim.py::test_a")
    cluster = {
        scope("tests/integration/test_slurm.py::test_every_output_is_complete"),
        scope("tests/integration/test_slurm_cpus.py::TestCpus::test_x"),
        scope("tests/preflight/test_preflight_slurm.py::test_y[a::b]"),
    }
    assert cluster == {"slurm"}
    assert scope("tests/slurm_like/test_other.py::test_z") == "tests/slurm_like/test_other.py"


def test_every_test_file_that_uses_the_cluster_is_named_slurm():
    """A test using the cluster (`require(slurm_problem...)`, sbatch, squeue) in a file not named *slurm*
    would run beside the other SLURM tests and find the node busy."""
    users = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
        if path != Path(__file__).resolve()
        and any(
            word in path.read_text(encoding="utf-8")
            for word in ("sbatch", "squeue", "sinfo", "scontrol", "pytest.mark.slurm")
        )
    }
    assert users, "no test uses the cluster?"
    assert all("slurm" in Path(user).name for user in users), sorted(users)
