"""Every reference in the repository can be followed inside it.

A file the repository tracks (or will track: `git ls-files --cached --others --exclude-standard`)
must not point at a path outside the repository, at a work item or planning document, or at a
reading anchor that docs/readings/ does not define. Readings are cited as
`docs/readings/<page>.md#<id>` or by their id (`PFML-R7`, `PROTO-R2`, lower or upper case).

The patterns are assembled from pieces so that this file does not match itself; it is the only
file left out.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve()
READINGS = ROOT / "docs" / "readings"
PAGE_OF = {"pfml": "pfml.md", "rsw": "rsw.md", "asap": "asap.md", "proto": "protocols.md"}

_S, _SECTION = "spec", "\u00a7"
FORBIDDEN = {
    "a folder outside the repository": re.compile(r"(?<![\w.-])" + "sha" + r"red/|\b" + _S + r"s/|/wo" + r"rk/"),
    "a planning document": re.compile(
        r"DESI" + r"GN\.md|\bdesi" + r"gn notes?\b|\bstee" + r"ring\b|"
        r"reference-implem" + r"entations|snakemake-sl" + r"urm\.md"
    ),
    "a work item": re.compile(r"\bissu" + r"e \[\d+/\d+\]|\[\d+/\d+\]|\bwork ite" + r"ms?\b"),
    "a section of a document outside the repository": re.compile(
        r"\b[Ss]"
        + _S[1:]
        + r" "
        + _SECTION
        + r"|\b"
        + _S
        + r"'s\b|\b"
        + _S
        + r" \[|\("
        + _S
        + r"[ \"]|\b"
        + _S
        + r" (?:A|PT|T)\d|\b(?:pfml|rsw|asap)\.md "
        + _SECTION
    ),
}
READING_ID = re.compile(r"\b(pfml|rsw|asap|proto)-r(\d+)\b", re.IGNORECASE)
READING_LINK = re.compile(r"\b(pfml|rsw|asap|protocols)\.md#([\w-]+)")
PAGE_LINK = re.compile(r"docs/readings/([\w-]+\.md)")
PARENT_PATH = re.compile(r"(?:\.\./)+[\w./-]*")


def defined_anchors(readings_dir: Path = READINGS) -> dict[str, str]:
    """anchor id -> page file name, for every `<a id="...">` in docs/readings/*.md."""
    anchors = {}
    for page in sorted(readings_dir.glob("*.md")):
        for anchor in re.findall(r'<a id="([\w-]+)"></a>', page.read_text(encoding="utf-8")):
            anchors[anchor] = page.name
    return anchors


def problems(path: Path, text: str, anchors: dict[str, str], root: Path = ROOT) -> list[str]:
    """'line N: what' for every reference of `text` (the content of `path`) that cannot be followed."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            for match in pattern.finditer(line):
                found.append(f"line {number}: {what}: {match.group(0)!r}")
        for match in READING_ID.finditer(line):
            if match.group(0).lower() not in anchors:
                found.append(f"line {number}: no reading {match.group(0)!r} in docs/readings")
        for match in READING_LINK.finditer(line):
            page, anchor = match.group(1) + ".md", match.group(2)
            prefix = anchor.split("-")[0].lower()
            if prefix in PAGE_OF and (anchors.get(anchor) != page or PAGE_OF[prefix] != page):
                found.append(f"line {number}: no anchor #{anchor} in docs/readings/{page}")
        for match in PAGE_LINK.finditer(line):
            if not (root / "docs" / "readings" / match.group(1)).is_file():
                found.append(f"line {number}: no page docs/readings/{match.group(1)}")
        for match in PARENT_PATH.finditer(line):
            target = (path.parent / match.group(0)).resolve()
            if not target.is_relative_to(root):
                found.append(f"line {number}: a path outside the repository: {match.group(0)!r}")
    return found


def repository_files() -> list[Path]:
    listed = (
        subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    return [ROOT / name for name in listed if name and (ROOT / name).is_file() and (ROOT / name).resolve() != SELF]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_every_reference_in_the_repository_can_be_followed():
    anchors = defined_anchors()
    report = []
    for path in repository_files():
        text = _text(path)
        if text is not None:
            report += [f"{path.relative_to(ROOT)}: {p}" for p in problems(path, text, anchors)]
    assert not report, f"{len(report)} references cannot be followed:\n" + "\n".join(report)


def test_the_readings_pages_define_their_anchors_once_each_on_their_own_page():
    seen = []
    for page in sorted(READINGS.glob("*.md")):
        ids = re.findall(r'<a id="([\w-]+)"></a>\s*\n#+ ([A-Z]+-R\d+) ', page.read_text(encoding="utf-8"))
        assert ids, page
        for anchor, heading in ids:
            assert anchor == heading.lower(), (page.name, anchor, heading)  # the heading names its anchor
            assert PAGE_OF[anchor.split("-")[0]] == page.name, (page.name, anchor)
        seen += [anchor for anchor, _ in ids]
    assert len(seen) == len(set(seen))


BAD = [  # (line, the kind of problem it must raise), each assembled so that this file stays clean
    ("see /wo" + "rk/sha" + "red/papers/pfml.txt", "a folder outside the repository"),
    ("as in spe" + "cs/pfml.md", "a folder outside the repository"),
    ("the stee" + "ring repository", "a planning document"),
    ("DESIGN" + ".md says", "a planning document"),
    ("iss" + "ue [" + "4/7] item 6", "a work item"),
    ("item [" + "3/7]", "a work item"),
    ("spec " + "\u00a73.3 reading", "a section of a document outside the repository"),
    ("(rsw.md " + "\u00a73.5)", "a section of a document outside the repository"),
    ("PFML-R" + "999 says", "no reading"),
    ("docs/readings/pfml.md#pfml-r" + "999", "no anchor"),
    ("docs/readings/protocols.md#" + "pfml-r1", "no anchor"),
    ("docs/readings/nowhere" + ".md", "no page"),
    ("open ../../" + "../outside.txt", "a path outside the repository"),
]


@pytest.mark.parametrize("line, kind", BAD)
def test_each_kind_of_broken_reference_is_found(line, kind):
    found = problems(ROOT / "docs" / "x.md", line, defined_anchors())
    assert any(kind in problem for problem in found), found


@pytest.mark.parametrize(
    "line",
    [
        "docs/readings/pfml.md#pfml-r1 and PROTO-R1",
        "[training](../training.md)",
        "pfml.md#pfml-r7",
        "results/report/index.html",
    ],
)
def test_references_that_resolve_are_not_reported(line):
    assert problems(READINGS / "x.md", line, defined_anchors()) == []
