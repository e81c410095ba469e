"""dmlrepro.report.browser (`dmlrepro check-report`) in headless Chromium: a clean page passes; a
broken image, a script that throws, a script that does not load, a rejected promise and a
console.error, in the page or in another script file, are each caught (a required integration
check: tests/conftest.py `require`)."""

from __future__ import annotations

import pytest
from PIL import Image

from dmlrepro.report.browser import check_report, find_chromium, main

from ..conftest import require

CLEAN = """<!doctype html><html><head><title>report</title><script src="app.js"></script></head>
<body><h1>report</h1><img src="fig.png"><script>console.log("a log line"); console.warn("a warning");</script>
{plant}</body></html>"""
APP = "console.info('app loaded');\n"

#: what is planted -> what the check must report (key, an excerpt of the entry)
PLANTS = {
    "broken image": ('<img src="figures/missing.png">', "broken", "figures/missing.png"),
    "script that throws": ("<script>null.field;</script>", "console_errors", "uncaught TypeError"),
    "other script that throws": (
        '<script src="other.js"></script>',
        "console_errors",
        "thrown in other.js (other.js:2)",
    ),
    "script that does not load": (
        '<script src="gone.js"></script>',
        "console_errors",
        "failed to load <script> gone.js",
    ),
    "console error": ('<script>console.error("bad", 42);</script>', "console_errors", "console.error: bad 42"),
    "console error in another script": (
        '<script src="logs.js"></script>',
        "console_errors",
        "console.error: from logs.js",
    ),
    "rejected promise": (
        '<script>Promise.reject(new Error("nope"));</script>',
        "console_errors",
        "unhandled rejection: Error: nope",
    ),
}


@pytest.fixture(scope="module")
def chromium():
    require(
        None
        if find_chromium()
        else "chromium is not on PATH (.ci/install-chromium installs it): the browser check cannot run"
    )


def _report(folder, plant: str = "") -> str:
    folder.mkdir()
    Image.new("RGB", (8, 8), "white").save(folder / "fig.png")
    (folder / "app.js").write_text(APP)
    (folder / "other.js").write_text("const x = 1;\nthrow new Error('thrown in other.js');\n")
    (folder / "logs.js").write_text("console.error('from logs.js');\n")
    (folder / "index.html").write_text(CLEAN.format(plant=plant))
    return str(folder / "index.html")


def test_a_clean_report_passes(chromium, tmp_path, capsys):
    index = _report(tmp_path / "clean")
    assert check_report(index) == {"images": 1, "broken": [], "console_errors": []}  # log and warn are not errors
    assert main([index]) == 0
    assert sorted(p.name for p in (tmp_path / "clean").iterdir()) == [
        "app.js",
        "fig.png",
        "index.html",
        "logs.js",
        "other.js",
    ]  # its copy is gone


@pytest.mark.parametrize("plant", list(PLANTS))
def test_each_planted_fault_is_caught(chromium, tmp_path, plant):
    html, key, excerpt = PLANTS[plant]
    index = _report(tmp_path / "report", html)
    result = check_report(index)
    other = "console_errors" if key == "broken" else "broken"
    assert any(excerpt in entry for entry in result[key]) and result[other] == [], result
    assert main([index]) == 1


def test_a_screenshot_is_written(chromium, tmp_path):
    index = _report(tmp_path / "report")
    check_report(index, tmp_path / "shot.png", height=600)
    assert Image.open(tmp_path / "shot.png").size == (1300, 600)
