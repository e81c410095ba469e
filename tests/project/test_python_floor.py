"""The Python floor: archive extraction uses tarfile's filter="data", which Python added in 3.11.4
(Python docs, tarfile, "Extraction filters"); pyproject's requires-python and setup.sh's check both
say so."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]
FLOOR = "3.11.4"


def test_requires_python_refuses_what_lacks_the_data_filter():
    spec = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    assert "3.11.3" not in spec and FLOOR in spec and "3.12.0" in spec


def test_setup_sh_checks_the_same_floor():
    (check,) = re.findall(r"sys\.version_info < \(([\d, ]+)\)", (REPO / "setup.sh").read_text())
    assert tuple(int(part) for part in check.split(",")) == tuple(int(part) for part in FLOOR.split("."))
    assert f"Python >= {FLOOR} needed" in (REPO / "setup.sh").read_text()


def test_the_archives_use_the_data_filter():
    assert 'filter="data"' in (REPO / "src/dmlrepro/data/archives.py").read_text()
