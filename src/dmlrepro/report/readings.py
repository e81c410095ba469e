"""Links from a report section to the readings its runs depend on.

A reading is an entry of docs/readings/<page>.md marked by an explicit anchor line
`<a id="pfml-r7"></a>` directly above its heading `### PFML-R7 — <title>`. An experiment lists the
anchors it depends on in `report.readings`; the report links each one, relative to the folder of
the rendered index.html, so the links work wherever the results folder lies on the same machine.

A reading is *consequential* when its entry has a paragraph starting `**Consequential.**`: the paper is
silent and the choice can move a headline number, so the claims that rest on it are trained under each
alternative too (config/claims.yaml `sensitivity`, docs/report.md#verdicts).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from dmlrepro.config_names import loss_catalog

#: anchor prefix -> page of docs/readings: each paper's that declares one (dmlrepro.losses.registry), and the
#: evaluation protocols'
PAGES = {
    **{key: paper["readings"] for key, paper in loss_catalog()[1].items() if paper["readings"]},
    "proto": "protocols.md",
}
ANCHOR = re.compile(rf"^({'|'.join(map(re.escape, PAGES))})-r[1-9][0-9]*$")
_ENTRY = re.compile(r'<a id="([a-z]+-r[0-9]+)"></a>\s*\n#+\s*(.+)')
_CONSEQUENTIAL = "**Consequential.**"


def readings_dir_of(repository: str | os.PathLike) -> Path:
    """docs/readings of a repository (the workflow's base directory)."""
    return Path(repository) / "docs" / "readings"


def page_anchors(page: str | os.PathLike) -> dict[str, str]:
    """anchor id -> its heading text, for every anchored entry of one readings page."""
    return {m.group(1): m.group(2).strip() for m in _ENTRY.finditer(Path(page).read_text(encoding="utf-8"))}


def consequential_anchors(page: str | os.PathLike) -> set[str]:
    """The anchor ids of one readings page whose entry (up to the next anchor) marks itself consequential."""
    text = Path(page).read_text(encoding="utf-8")
    found = list(_ENTRY.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return {m.group(1) for m, end in zip(found, ends, strict=True) if f"\n{_CONSEQUENTIAL}" in text[m.end() : end]}


def reading_links(
    ids: Iterable[str], readings_dir: str | os.PathLike, from_dir: str | os.PathLike, where: str = "report.readings"
) -> list[dict[str, str]]:
    """One {id, title, href, consequential} per anchor id; `href` is relative to `from_dir` (the report's folder).

    ValueError (naming `where`) for an id that is not of the form page-rN or not an anchor of its page."""
    readings_dir, links, pages = Path(readings_dir).resolve(), [], {}
    for anchor in ids:
        if not isinstance(anchor, str) or not ANCHOR.match(anchor):
            raise ValueError(f"{where}: {anchor!r} is not a reading id like 'pfml-r7' ({', '.join(PAGES)})")
        page = readings_dir / PAGES[anchor.split("-")[0]]
        if page not in pages:
            pages[page] = (page_anchors(page), consequential_anchors(page)) if page.is_file() else ({}, set())
        titles, consequential = pages[page]
        if anchor not in titles:
            raise ValueError(f"{where}: {anchor!r} is not an anchor of {page}")
        href = Path(os.path.relpath(page, Path(from_dir).resolve())).as_posix()
        links.append(
            {
                "id": anchor.upper(),
                "title": titles[anchor],
                "href": f"{href}#{anchor}",
                "consequential": anchor in consequential,
            }
        )
    return links
