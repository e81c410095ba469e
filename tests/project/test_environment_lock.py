"""requirements.lock (docs/environment.md): every dependency of dmlrepro[cpu,dev] pinned, inside
pyproject.toml's ranges, with hashes; setup.sh installs it with --require-hashes; and this
environment is exactly the lock (what a fresh clone's setup.sh gives)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from dmlrepro.environment_lock import LOCK_FILE, lock_differences, lock_record, locked_versions, normalized

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / LOCK_FILE


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [
        Requirement(r)
        for r in project["dependencies"]
        + project["optional-dependencies"]["cpu"]
        + project["optional-dependencies"]["dev"]
    ]


def test_every_declared_dependency_is_locked_inside_its_range():
    locked = locked_versions(LOCK)
    for requirement in _declared():
        name = normalized(requirement.name)
        assert name in locked, f"{name} is not in {LOCK_FILE}"
        assert requirement.specifier.contains(locked[name], prereleases=True), (name, locked[name])
    assert {"torch", "torchvision"} <= set(locked)  # resolved together, in one lock


def test_every_pin_has_a_hash():
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text())  # a pin and its hash lines; the header is comments
    pins = [block for block in blocks if "==" in block.splitlines()[0]]
    assert len(pins) == len(locked_versions(LOCK))
    assert all(re.search(r"--hash=sha256:[0-9a-f]{64}", block) for block in pins)


def test_setup_installs_the_lock_with_its_hashes():
    setup = (REPO / "setup.sh").read_text()
    assert f"pip install --quiet --require-hashes -r {LOCK_FILE}" in setup
    assert "pip install --quiet --no-deps -e ." in setup and '".[cpu,dev]"' not in setup


def test_this_environment_is_the_lock():
    assert lock_differences(LOCK) == []


def test_a_difference_is_named(tmp_path):
    lock = tmp_path / LOCK_FILE
    lock.write_text("numpy==0.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    assert lock_differences(lock, {"numpy": "2.1.0", "extra-thing": "1.0", "pip": "26.0"}) == [
        "numpy: locked 0.0, installed 2.1.0",
        "extra-thing: installed 1.0, not locked",
    ]
    record = lock_record(tmp_path)
    assert record["locked"] == {"numpy": "0.0"} and len(record["sha256"]) == 64
    assert lock_record(tmp_path / "nowhere")["differences"] == [f"no {LOCK_FILE} in {tmp_path / 'nowhere'}"]


def test_the_reports_provenance_lists_the_locked_versions(tmp_path):
    from dmlrepro.report import provenance, render_report

    prov = provenance(REPO, [], {})
    assert prov["lock"]["locked"] == locked_versions(LOCK) and prov["lock"]["differences"] == []
    html = tmp_path / "index.html"
    render_report([], [], prov, html, REPO / "reports" / "templates")
    text = html.read_text()
    assert f"Locked environment: {LOCK_FILE} ({len(prov['lock']['locked'])} packages" in text
    assert "this environment is exactly the lock" in text
    torch = locked_versions(LOCK)["torch"]
    assert f'<tr><td class="label">torch</td><td class="label">{torch}</td></tr>' in text
