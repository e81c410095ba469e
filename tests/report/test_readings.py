"""A report section links the readings its runs depend on (report.readings -> docs/readings/<page>.md#<id>)."""

import os
import re
from pathlib import Path

import pytest
import yaml

from dmlrepro.report.html import render_report
from dmlrepro.report.readings import consequential_anchors, page_anchors, reading_links

ROOT = Path(__file__).resolve().parents[2]
READINGS = ROOT / "docs" / "readings"
TEMPLATES = ROOT / "reports" / "templates"


class Provenance(dict):  # the fields a bare section does not use are empty
    def __missing__(self, key):
        return ""


def _section(readings):
    return {
        "experiment": "pfml_fig3c_alpha",
        "kind": "table",
        "title": "Fig. 3c",
        "description": "",
        "paper_says": "",
        "reported": None,
        "block": None,
        "table": None,
        "figures": [],
        "notes": [],
        "readings": readings,
        "ratios": [],
        "hparams": [],
        "runs": [],
    }


def _render(tmp_path, sections, out):
    provenance = Provenance(total_hours=0.0, packages={}, hours_per_experiment={}, runs=[])
    render_report(sections, [tmp_path] * len(sections), provenance, out, TEMPLATES)
    return out.read_text()


def test_a_page_lists_its_anchored_headings(tmp_path):
    page = tmp_path / "pfml.md"
    page.write_text(
        '# t\n\n<a id="pfml-r1"></a>\n### PFML-R1 — α = 0\n\ntext\n\n### not anchored\n'
        '<a id="pfml-r2"></a>\n### PFML-R2 — Self-terms\n'
    )
    assert page_anchors(page) == {"pfml-r1": "PFML-R1 — α = 0", "pfml-r2": "PFML-R2 — Self-terms"}


def test_links_from_the_default_report_folder_reach_the_page_and_its_anchor():
    report_dir = ROOT / "results" / "report"  # results/report/index.html of the embedded default
    links = reading_links(["pfml-r1", "proto-r3"], READINGS, report_dir)
    assert [link["href"] for link in links] == [
        "../../docs/readings/pfml.md#pfml-r1",
        "../../docs/readings/protocols.md#proto-r3",
    ]
    for link in links:
        path, anchor = link["href"].split("#")
        page = (report_dir / path).resolve()
        assert page.is_file() and f'<a id="{anchor}"></a>' in page.read_text()
    assert links[0]["id"] == "PFML-R1" and links[0]["title"].startswith("PFML-R1 — α = 0")


MISSING = "pfml-r" + "999"  # built from pieces: tests/project/test_references.py would reject it written whole


@pytest.mark.parametrize(
    "anchor, match",
    [
        (MISSING, rf"'{MISSING}' is not an anchor of .*pfml\.md"),
        ("PFML-R1", r"'PFML-R1' is not a reading id like 'pfml-r7'"),
        ("paper-r1", r"'paper-r1' is not a reading id"),
    ],
)
def test_an_unknown_reading_is_an_error_naming_the_experiment(tmp_path, anchor, match):
    with pytest.raises(ValueError, match=r"experiments\.pfml_fig3c_alpha\.report\.readings: " + match):
        _render(tmp_path, [_section([anchor])], tmp_path / "out" / "index.html")


def test_the_report_renders_the_links_relative_to_its_folder(tmp_path):
    out = tmp_path / "results" / "report" / "index.html"
    html = _render(tmp_path, [_section(["pfml-r1", "proto-r1"]), _section([])], out)
    hrefs = re.findall(r'<a href="([^"]+)">(PFML-R1|PROTO-R1)', html)
    expected = Path(os.path.relpath(READINGS, out.parent)).as_posix()
    assert hrefs == [(f"{expected}/pfml.md#pfml-r1", "PFML-R1"), (f"{expected}/protocols.md#proto-r1", "PROTO-R1")]
    assert html.count("Readings these runs depend on") == 1  # a section without readings shows none


@pytest.mark.parametrize("config", ["config/config.yaml", "config/paper.yaml"])
def test_every_reading_a_config_lists_exists(config):
    experiments = yaml.safe_load((ROOT / config).read_text())["experiments"]
    listed = {name: (e.get("report") or {}).get("readings") or [] for name, e in experiments.items()}
    for name, readings in listed.items():
        reading_links(readings, READINGS, ROOT / "results" / "report", f"experiments.{name}.report.readings")
    pfml = [name for name in listed if name.startswith("pfml_")]
    assert pfml and all(listed[name] for name in pfml), [name for name in pfml if not listed[name]]


def test_an_entry_marks_itself_consequential(tmp_path):
    page = tmp_path / "pfml.md"
    page.write_text(
        '# t\n\n**Consequential.** in the header counts for no entry\n\n<a id="pfml-r1"></a>\n### PFML-R1 — a\n\n'
        'text **Consequential.** inside a line\n\n<a id="pfml-r2"></a>\n### PFML-R2 — b\n\n**Consequential.** yes\n'
    )
    assert consequential_anchors(page) == {"pfml-r2"}


def test_the_readings_a_headline_number_rests_on_are_marked_consequential():
    """Clipping, the schedule, δ and α, the miniature's training length, RSW's α scaling and ASAP's lr in
    miniature: the paper is silent and the choice moves a headline number (docs/report.md#verdicts)."""
    marked = set().union(*(consequential_anchors(page) for page in READINGS.glob("*.md")))
    assert {"pfml-r4", "pfml-r15", "pfml-r22", "proto-r10", "rsw-r25", "asap-r40"} <= marked
    links = reading_links(["pfml-r4", "pfml-r1"], READINGS, ROOT)
    assert [link["consequential"] for link in links] == [True, False]


def test_a_section_says_which_of_its_readings_are_consequential(tmp_path):
    html = _render(tmp_path, [_section(["pfml-r4", "pfml-r1"])], tmp_path / "out" / "index.html")
    note = html[html.index("Readings these runs depend on") :].split("</p>", 1)[0]
    r4, r1 = note.split(";")
    assert "PFML-R4" in r4 and "consequential" in r4
    assert "PFML-R1" in r1 and "consequential" not in r1
