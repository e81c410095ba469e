"""The docs a user can walk: the map (docs/README.md) lists every page, the task pages' links lead to files, and
the licence and citation agree with pyproject.toml and the papers' readings (docs/licences.md)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def relative_links(page: Path) -> list[str]:
    """The page's markdown links to files (not web addresses), anchors dropped."""
    return [target for target in LINK.findall(page.read_text(encoding="utf-8")) if "://" not in target]


def test_the_map_lists_every_page():
    listed = {(DOCS / target).resolve() for target in relative_links(DOCS / "README.md")}
    pages = {page.resolve() for page in [*DOCS.glob("*.md"), *DOCS.glob("tasks/*.md"), *DOCS.glob("readings/*.md")]}
    assert sorted(str(page.relative_to(DOCS)) for page in pages - listed - {(DOCS / "README.md").resolve()}) == []


def test_the_task_pages_links_lead_to_files():
    pages = [*DOCS.glob("tasks/*.md"), DOCS / "licences.md", DOCS / "README.md"]
    missing = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert missing == []


def test_the_licence_and_citation_agree_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert project["license"] == citation["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License") and project["license-files"] == ["LICENSE"]
    assert citation["version"] == project["version"] and citation["cff-version"] == "1.2.0"


def test_the_citations_arxiv_ids_are_the_readings():
    """Only what the readings state: PFML's and RSW's arXiv ids; ASAP, under review, has none."""
    references = {ref["title"]: ref for ref in yaml.safe_load((ROOT / "CITATION.cff").read_text())["references"]}
    readings = {key: (DOCS / "readings" / f"{key}.md").read_text() for key in ("pfml", "rsw", "asap")}
    for key, title in [("pfml", "Potential Field Based"), ("rsw", "Realigned Softmax Warping")]:
        (ref,) = [ref for name, ref in references.items() if name.startswith(title)]
        (arxiv,) = set(re.findall(r"arXiv:(\d{4}\.\d{5})", readings[key].split("\n\n")[1]))
        assert ref["identifiers"][0]["value"] == f"arXiv:{arxiv}" and ref["url"].endswith(arxiv)
    (asap,) = [ref for name, ref in references.items() if name.startswith("ASAP DML")]
    assert "identifiers" not in asap and "Anonymous" in readings["asap"]
