"""Jobs import the checkout they were started from: the Snakefile puts its src/ first on PYTHONPATH
(docs/preflight.md#conda; the conda environments this file once checked were removed, untestable)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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
    """Parsing the Snakefile puts the checkout's src/ first on PYTHONPATH (every job inherits it), once,
    before what was there."""
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
