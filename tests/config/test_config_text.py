"""The workflow configs as text: YAML ends a plain scalar at " #", so a value such as
`title: ASAP Fig. 3 — #proxy and pool size` silently becomes "ASAP Fig. 3 —" (this happened).
Comments here are written "# text"; a " #" followed by anything but a space, outside quotes, is
such a cut value."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = [ROOT / "config" / name for name in ("config.yaml", "paper.yaml", "real_data.yaml")] + [
    ROOT / "tests" / "workflow" / "tiny.yaml"
]
QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'')


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_no_value_is_cut_by_a_hash(path):
    cut = [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\s#[^\s#]", QUOTED.sub('""', line))
    ]
    assert not cut, "values cut at ' #' (quote them or reword):\n" + "\n".join(cut)


def test_the_check_finds_a_cut_title(tmp_path):
    line = "      title: ASAP Fig. 3 — #proxy and pool size"
    assert re.search(r"\s#[^\s#]", QUOTED.sub('""', line))
    assert not re.search(r"\s#[^\s#]", QUOTED.sub('""', '      paper_says: "λ = 2e-4, #proxy = 8"  # a comment'))
