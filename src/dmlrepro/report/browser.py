"""Check a built report in headless Chromium: every image loads, no console errors, a screenshot.

`dmlrepro check-report results/report/index.html [--screenshot FILE]`. A checker page loads
the report in an iframe (file:// access allowed between the two) and lists the images whose
naturalWidth is 0; console messages of level error come from Chromium's log."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHECKER = """<html><body><iframe id="f" src="{src}" width="1300" height="900"></iframe><pre id="out">pending</pre>
<script>
document.getElementById("f").onload = function () {{
  const imgs = Array.from(this.contentDocument.images);
  const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src"));
  document.getElementById("out").textContent = JSON.stringify({{images: imgs.length, broken: broken}});
}};
</script></body></html>"""
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--allow-file-access-from-files"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def check_report(index_html: str | os.PathLike, screenshot: str | os.PathLike | None = None,
                 height: int = 4000, timeout: float = 120) -> dict:
    """{"images": n, "broken": [src...], "console_errors": [line...]} for the report at `index_html`."""
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no chromium found on PATH (apt-get install chromium)")
    index_html = Path(index_html).resolve()
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=index_html.parent, delete=False) as checker, \
            tempfile.TemporaryDirectory() as profile:  # a fresh profile: no lock shared with another chromium
        checker.write(CHECKER.format(src=index_html.name))
        checker.close()
        try:
            dom = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", checker.name],
                                 capture_output=True, text=True, timeout=timeout)
        finally:
            os.unlink(checker.name)
    found = re.search(r'<pre id="out">([^<]*)</pre>', dom.stdout)
    if not found or found.group(1) == "pending":
        raise RuntimeError(f"chromium did not load {index_html}: {dom.stderr[-2000:]}")
    result = json.loads(found.group(1))
    shot = [f"--screenshot={Path(screenshot).resolve()}"] if screenshot else ["--dump-dom"]
    with tempfile.TemporaryDirectory() as profile:
        run = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size=1300,{height}",
                              "--enable-logging=stderr", "--v=0", *shot, index_html.as_uri()],
                             capture_output=True, text=True, timeout=timeout)
    result["console_errors"] = [line for line in run.stderr.splitlines()
                                if ":CONSOLE" in line and index_html.name in line]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dmlrepro check-report", description=__doc__.splitlines()[0])
    parser.add_argument("index_html", help="the report, e.g. results/report/index.html")
    parser.add_argument("--screenshot", help="also write a full-page PNG screenshot here")
    parser.add_argument("--height", type=int, default=4000, help="screenshot height in pixels (default 4000)")
    args = parser.parse_args(argv)
    result = check_report(args.index_html, args.screenshot, args.height)
    print(f"{result['images']} images, {len(result['broken'])} broken {result['broken']}, "
          f"{len(result['console_errors'])} console messages")
    for line in result["console_errors"]:
        print("  ", line)
    return 1 if result["broken"] or result["console_errors"] else 0
