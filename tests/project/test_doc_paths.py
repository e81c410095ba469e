"""Every module path the docs name exists: `src/dmlrepro/...py` in any docs/*.md, and each
backticked `.py` / `.smk` path of docs/architecture.md (a bare `pkg/module.py` there is under
src/dmlrepro/, a path from the repository root starts with its top folder)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "dmlrepro"
SOURCE_PATH = re.compile(r"src/dmlrepro/[\w/]+\.py")
BACKTICKED = re.compile(r"`([\w./-]+\.(?:py|smk))`")
ROOT_FOLDERS = ("src/", "tests/", "workflow/", "benchmarks/")


def missing_source_paths(docs: Path = ROOT / "docs", root: Path = ROOT) -> list[str]:
    """'doc: path' for every `src/dmlrepro/...py` path of docs/*.md that is not a file."""
    return [
        f"{doc.name}: {path}"
        for doc in sorted(docs.glob("*.md"))
        for path in sorted(set(SOURCE_PATH.findall(doc.read_text(encoding="utf-8"))))
        if not (root / path).is_file()
    ]


def missing_architecture_paths(
    doc: Path = ROOT / "docs" / "architecture.md", root: Path = ROOT, package: Path = PACKAGE
) -> list[str]:
    """The backticked module and rule-file paths of the architecture page that are not files."""
    missing = []
    for path in sorted(set(BACKTICKED.findall(doc.read_text(encoding="utf-8")))):
        base = root if path.startswith(ROOT_FOLDERS) else package
        if not (base / path).is_file():
            missing.append(path)
    return missing


def test_every_source_path_in_the_docs_exists():
    assert missing_source_paths() == []


def test_every_module_the_architecture_page_names_exists():
    assert missing_architecture_paths() == []


def test_a_renamed_module_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "src" / "dmlrepro" / "train").mkdir(parents=True)
    (tmp_path / "src" / "dmlrepro" / "train" / "run_data.py").write_text("")
    page = tmp_path / "docs" / "architecture.md"
    page.write_text("`train/run_data.py`, `train/data.py` and src/dmlrepro/train/evaluate.py\n")
    assert missing_source_paths(tmp_path / "docs", tmp_path) == ["architecture.md: src/dmlrepro/train/evaluate.py"]
    assert missing_architecture_paths(page, tmp_path, tmp_path / "src" / "dmlrepro") == ["train/data.py"]
