"""Check a built report in headless Chromium: every image loads, no script fails, nothing is
logged as an error, nothing is cut off at the window's width, and optionally a screenshot of the
first screen.

`dmlrepro check-report results/report/index.html [--screenshot FILE] [--width 1400]`. Chromium opens
a copy of the report (beside it, so its relative links resolve) in a window of that size, whose first
script, before any of the report's own, records every `console.error` call, every uncaught exception
or rejected promise and every element that fails to load (a script, a stylesheet), from whichever
script or file it comes; after the load event it lists the images whose naturalWidth is 0, what
overflows (the page wider than the window, a scrolling box whose content is wider than the box) and
where the first table starts and writes its findings into the page, which `--dump-dom` returns.
(Chromium's own log cannot tell an error from a `console.log`: it prints both as INFO:CONSOLE.)"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: the first script of the checked copy; its findings end up in <pre id="dmlrepro-check">
PROBE = """<script>
(function () {
  const errors = [];
  const where = (file, line) => file ? ` (${file.split("/").pop()}:${line})` : "";
  const text = (args) => Array.from(args).map(a => a instanceof Error ? `${a.name}: ${a.message}` : String(a)).join(" ");
  const consoleError = console.error;
  console.error = function () { errors.push("console.error: " + text(arguments)); consoleError.apply(console, arguments); };
  window.addEventListener("error", function (event) {
    const target = event.target;
    if (target && target !== window && target.tagName) {  // a resource; a broken <img> is listed by the load handler
      if (target.tagName !== "IMG") errors.push(`failed to load <${target.tagName.toLowerCase()}> ${target.getAttribute("src") || target.getAttribute("href")}`);
    } else {
      errors.push("uncaught " + (event.error ? text([event.error]) : event.message) + where(event.filename, event.lineno));
    }
  }, true);
  window.addEventListener("unhandledrejection", function (event) { errors.push("unhandled rejection: " + text([event.reason])); });
  window.addEventListener("load", function () {
    const images = Array.from(document.images);
    const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src"));
    const name = (e) => {
      const section = e.closest("section[id]");
      return `<${e.tagName.toLowerCase()}>` + (section ? ` in #${section.id}` : "");
    };
    const table = document.querySelector("table");
    const first = table ? {top: Math.round(table.getBoundingClientRect().top + window.scrollY), in: name(table)} : null;
    const overflowing = [];
    const page = document.documentElement.scrollWidth;
    if (page > window.innerWidth) overflowing.push(`the page: ${page} px wide in a ${window.innerWidth} px window`);
    for (const e of document.body.querySelectorAll("*")) {  // a scrolling box whose content is cut off, in a closed <details> too
      if (getComputedStyle(e).overflowX !== "visible" && e.scrollWidth > e.clientWidth + 1)
        overflowing.push(`${name(e)}: ${e.scrollWidth} px of content in ${e.clientWidth} px`);
    }
    const out = document.createElement("pre");
    out.id = "dmlrepro-check";
    out.textContent = JSON.stringify({images: images.length, broken: broken, console_errors: errors,
      overflowing: overflowing, window: [window.innerWidth, window.innerHeight], first_table: first});
    document.body.appendChild(out);
  });
})();
</script>"""
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--allow-file-access-from-files"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def with_probe(page: str) -> str:
    """The report's HTML with PROBE as the first thing in its <head> (before every script of its own)."""
    head = re.search(r"<head[^>]*>", page, re.IGNORECASE)
    if head is None:
        return PROBE + page
    return page[: head.end()] + PROBE + page[head.end() :]


#: the window: 1,400 px wide, one laptop screen high
WIDTH, HEIGHT = 1400, 900


def check_report(
    index_html: str | os.PathLike,
    screenshot: str | os.PathLike | None = None,
    height: int = HEIGHT,
    timeout: float = 120,
    width: int = WIDTH,
) -> dict:
    """The report at `index_html` in a `width` × `height` window: {"images": n, "broken": [src...],
    "console_errors": [message...], "overflowing": [what is cut off...], "window": [width, height],
    "first_table": {"top": px from the page's top, "in": "<table> in #section"} or None}; `screenshot`:
    a PNG of that window (the first screen)."""
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no chromium found on PATH (apt-get install chromium)")
    index_html = Path(index_html).resolve()
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=index_html.parent, delete=False) as checked:
        checked.write(with_probe(index_html.read_text(encoding="utf-8")))
    try:
        dom = _chromium(browser, (width, height), timeout, "--dump-dom", Path(checked.name).as_uri())
    finally:
        os.unlink(checked.name)
    found = re.search(r'<pre id="dmlrepro-check">([^<]*)</pre>', dom.stdout)
    if not found:  # its stderr is mostly D-Bus noise: the exit status says enough
        raise RuntimeError(
            f"chromium ({browser}) did not load {index_html} (exit status {dom.returncode}); "
            f"expected a page it can open"
        )
    if screenshot:
        _chromium(browser, (width, height), timeout, f"--screenshot={Path(screenshot).resolve()}", index_html.as_uri())
    return json.loads(html.unescape(found.group(1)))


def _chromium(browser: str, window: tuple[int, int], timeout: float, *args: str) -> subprocess.CompletedProcess:
    """Headless chromium on ``args`` in a ``window``-sized window, with a fresh profile (no lock shared with
    another chromium)."""
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dmlrepro check-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("index_html", help="the report, e.g. results/report/index.html")
    parser.add_argument("--screenshot", help="also write a PNG of the first screen (the window) here")
    parser.add_argument("--width", type=int, default=WIDTH, help=f"window width in pixels (default {WIDTH})")
    parser.add_argument(
        "--height", type=int, default=HEIGHT, help=f"window height in pixels, the first screen (default {HEIGHT})"
    )
    args = parser.parse_args(argv)
    if not Path(args.index_html).is_file():
        print(
            f"dmlrepro check-report: {args.index_html}: file not found; expected a built report, "
            f"e.g. results/report/index.html",
            file=sys.stderr,
        )
        return 2
    try:
        result = check_report(args.index_html, args.screenshot, args.height, width=args.width)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
        print(f"dmlrepro check-report: {error}", file=sys.stderr)
        return 1
    first = result["first_table"]
    print(
        f"{result['images']} images, {len(result['broken'])} broken {result['broken']}, "
        f"{len(result['console_errors'])} console messages, {len(result['overflowing'])} overflowing; "
        + (f"first table at y = {first['top']} px ({first['in']})" if first else "no table")
        + " in a {} × {} px window".format(*result["window"])
    )
    for line in result["console_errors"] + result["overflowing"]:
        print("  ", line)
    return 1 if result["broken"] or result["console_errors"] or result["overflowing"] else 0
