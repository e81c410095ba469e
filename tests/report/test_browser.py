"""dmlrepro.report.browser (`dmlrepro check-report`) in headless Chromium: a clean page passes; a
broken image, a script that throws, a script that does not load, a rejected promise and a
console.error, in the page or in another script file, are each caught, and so is content cut off at
the window's width (a scrolling table, the page itself, a table inside a closed <details>); where the
first table starts is measured (a required integration check: tests/conftest.py `require`)."""

from __future__ import annotations

import pytest
from PIL import Image

from dmlrepro.report.browser import check_report, main

CLEAN = """<!doctype html><html><head><title>report</title><script src="app.js"></script></head>
<body><h1>report</h1><img src="fig.png"><script>console.log("a log line"); console.warn("a warning");</script>
{plant}</body></html>"""
APP = "console.info('app loaded');\n"
SCROLLING = "display:block;overflow-x:auto;max-width:100%"  # the report's tables: a scrolling box
WIDE = '<td style="white-space:nowrap">' + "a long failing check text " * 100 + "</td>"

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
    "table cut off in its scrolling box": (
        f'<section id="wide"><table style="{SCROLLING}"><tr>{WIDE}</tr></table></section>',
        "overflowing",
        "<table> in #wide: ",
    ),
    "page wider than the window": (
        '<div style="width:3000px">wide</div>',
        "overflowing",
        "px wide in a 1400 px window",
    ),
    "table cut off in a closed details": (
        f'<details><summary>more</summary><table style="{SCROLLING}"><tr>{WIDE}</tr></table></details>',
        "overflowing",
        "<table>: ",
    ),
}
FAILURES = ("broken", "console_errors", "overflowing")


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
    result = check_report(index)
    assert {k: result[k] for k in ("images", *FAILURES, "first_table")} == {
        "images": 1,
        "broken": [],
        "console_errors": [],  # log and warn are not errors
        "overflowing": [],
        "first_table": None,
    }
    assert result["window"][0] == 1400
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
    assert any(excerpt in entry for entry in result[key]), result
    assert all(result[other] == [] for other in FAILURES if other != key), result
    assert main([index]) == 1


def test_a_screenshot_is_written(chromium, tmp_path):
    index = _report(tmp_path / "report")
    check_report(index, tmp_path / "shot.png", height=600)
    assert Image.open(tmp_path / "shot.png").size == (1400, 600)
    check_report(index, tmp_path / "wide.png", height=500, width=1000)
    assert Image.open(tmp_path / "wide.png").size == (1000, 500)


@pytest.mark.parametrize("above", [100, 3000])
def test_where_the_first_table_starts(chromium, tmp_path, above):
    table = f'<div style="height:{above}px"></div><section id="s"><table><tr><td>1</td></tr></table></section>'
    result = check_report(_report(tmp_path / "report", table))
    first, window = result["first_table"], result["window"]
    assert first["in"] == "<table> in #s" and above <= first["top"] <= above + 100  # below <h1> and the image
    assert (first["top"] < window[1]) == (above < 500), (first, window)  # on the first screen or not
