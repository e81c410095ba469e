"""The conda environments as `snakemake --sdm conda` deploys them (docs/preflight.md#conda): what can
be checked without a conda channel."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENVS = {"gpu": REPO / "workflow/envs/dmlrepro-gpu.yaml", "cpu": REPO / "workflow/envs/dmlrepro-cpu.yaml"}
#: pip name -> conda-forge name, where they differ
CONDA_NAMES = {"torch": "pytorch", "matplotlib": "matplotlib-base"}
#: run by the Snakemake on the login node, not inside a job's env
NOT_IN_JOBS = {"snakemake", "snakemake-executor-plugin-slurm"}


def conda_names(path: Path) -> dict[str, str]:
    env = yaml.safe_load(path.read_text())
    names = {}
    for dep in env["dependencies"]:
        assert isinstance(dep, str), f"{path.name}: {dep!r}: a pip section installs from outside conda-forge"
        names[re.split(r"[<>=! ]", dep, maxsplit=1)[0]] = dep
    return names


@pytest.mark.parametrize("flavour", ["gpu", "cpu"])
def test_env_lists_the_project_dependencies_from_conda_forge_only(flavour):
    env = yaml.safe_load(ENVS[flavour].read_text())
    assert env["channels"] == ["conda-forge"]  # the pytorch channel stopped after 2.5; no nvidia channel
    names = conda_names(ENVS[flavour])
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {re.split(r"[<>=! \[]", dep, maxsplit=1)[0] for dep in project["dependencies"]} - NOT_IN_JOBS
    missing = sorted(CONDA_NAMES.get(name, name) for name in wanted if CONDA_NAMES.get(name, name) not in names)
    assert missing == []
    assert names["python"].startswith("python=3.11")
    faiss = {"gpu": "faiss-gpu", "cpu": "faiss-cpu"}[flavour]
    assert faiss in names and ({"faiss-gpu", "faiss-cpu"} - {faiss}).isdisjoint(names)  # one faiss only
    assert ("pytorch-gpu" in names and "cuda-version" in names) if flavour == "gpu" else "pytorch-cpu" in names


@pytest.mark.parametrize("flavour", ["gpu", "cpu"])
def test_env_installs_no_local_path(flavour):
    """Snakemake copies env files into .snakemake/conda/: a relative path (`-e ..`) points nowhere there."""
    text = re.sub(r"#.*", "", ENVS[flavour].read_text())  # without the comments
    assert "pip:" not in text and "-e " not in text and ".." not in text and "/" not in text
    assert not ENVS[flavour].with_suffix(".post-deploy.sh").exists()  # the checkout's src/ is on PYTHONPATH instead


def test_rules_use_the_envs():
    rules = "\n".join(p.read_text() for p in (REPO / "workflow/rules").glob("*.smk"))
    used = set(re.findall(r'conda:\s*\n\s*"\.\./(envs/[^"]+)"', rules))
    assert used == {"envs/dmlrepro-gpu.yaml", "envs/dmlrepro-cpu.yaml"}


PARSE = """
import os, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
repo, workdir = Path(sys.argv[1]), Path(sys.argv[2])
with SnakemakeApi(OutputSettings()) as api:
    api.workflow(snakefile=repo / "Snakefile", workdir=workdir, resource_settings=ResourceSettings(cores=1),
                 config_settings=ConfigSettings(configfiles=[repo / "tests/workflow/tiny.yaml"])).dag()
print("PYTHONPATH=" + os.environ.get("PYTHONPATH", ""))
"""


@pytest.mark.slow
def test_jobs_see_the_checkouts_src(tmp_path):
    """Parsing the Snakefile puts the checkout's src/ first on PYTHONPATH (every job inherits it, and a
    conda env's Python then imports the checkout's dmlrepro), once, before what was there."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    for before, expected in ((None, [str(REPO / "src")]), (f"/elsewhere{os.pathsep}{REPO / 'src'}", None)):
        if before is not None:
            env["PYTHONPATH"] = before
        done = subprocess.run(
            [sys.executable, "-c", PARSE, str(REPO), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen = done.stdout.strip().splitlines()[-1].removeprefix("PYTHONPATH=").split(os.pathsep)
        assert seen == (expected or before.split(os.pathsep))
