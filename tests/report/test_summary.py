"""The report's summary table (report.summary): one row per section with its headline cell (the first of
our rows at its first cell with a printed value), the count of compared cells within the combined
uncertainty, a link to the section; the experiments the workflow did not build as "not run — reason";
the table first on the page, before the Claims and the sections."""

from pathlib import Path

import pytest

from dmlrepro.report import provenance, render_report
from dmlrepro.report.sections import check_report
from dmlrepro.report.summary import summary_rows

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "reports" / "templates"


def _cell(ours=None, paper_text=None, delta=None, within=None, std=None):
    paper = None if paper_text is None else float(paper_text)
    return {
        "paper": paper,
        "paper_std": None,
        "paper_text": paper_text,
        "ours": ours,
        "ours_std": std,
        "delta": delta,
        "sigma": None,
        "within": within,
    }


def _section(name="pfml_table1", **extra):
    """PFML Table 1 shaped: a paper row, an untrained row, then ours; CUB R@1 has no printed value for PFML."""
    columns = [
        {"dataset": "CUB-200-2011", "ours_dataset": "cub200", "metric": "recall@1", "stand_in": False},
        {"dataset": "CUB-200-2011", "ours_dataset": "cub200", "metric": "recall@2", "stand_in": False},
    ]
    rows = [
        {"label": "Proxy Anchor", "source": "paper", "status": "", "cells": [_cell(None, "69.1"), _cell(None, "78.9")]},
        {"label": "untrained (epoch 0)", "source": "untrained", "status": "", "cells": [_cell(40.0), _cell(50.0)]},
        {
            "label": "Potential Field (Ours)",
            "source": "ours",
            "method": "pfml",
            "status": "5/5 seeds",
            "cells": [_cell(70.0, std=0.5), {**_cell(80.0, "83.0", -3.0, False, 0.4), "gain": 30.0}],  # untrained 50
        },
        {
            "label": "CPML",
            "source": "ours",
            "method": "cpml",
            "status": "5/5 seeds",
            "cells": [_cell(60.0, "60.5", -0.5, True), _cell()],
        },
    ]
    return {
        "experiment": name,
        "title": "PFML Table 1 — Recall@K",
        "table": {"columns": columns, "rows": rows, "uncertainty": "std"},
        "figures": [],
        **dict.fromkeys(["description", "paper_says", "reported", "block"], ""),
        **dict.fromkeys(["notes", "readings", "ratios", "hparams", "runs"], []),
        **extra,
    }


def test_the_headline_is_the_first_method_at_its_first_printed_cell():
    (row,) = summary_rows([_section()])
    headline = row["headline"]
    assert (headline["label"], headline["metric"]) == ("Potential Field (Ours)", "recall@2")  # R@1: no paper value
    assert (headline["ours"], headline["paper_text"], headline["delta"], headline["within"]) == (
        80.0,
        "83.0",
        -3.0,
        False,
    )
    assert (row["compared"], row["within"]) == (2, 1)  # PFML R@2 outside, CPML R@1 within; paper/untrained rows not


def test_report_headline_names_the_row_the_summary_shows():
    """ASAP Table 1 lists the baseline C2 first; `report.headline: c2_asap` puts ASAP's row in the summary."""
    headline = summary_rows([_section(headline="cpml")])[0]["headline"]
    assert (headline["label"], headline["metric"], headline["ours"], headline["paper_text"]) == (
        "CPML",
        "recall@1",
        60.0,
        "60.5",
    )


def test_a_headline_that_is_not_a_method_fails_at_parse_time():
    experiment = {"methods": ["c2", "c2_asap"], "datasets": ["cub200"], "report": {"headline": "c2_asapp"}}
    with pytest.raises(ValueError, match="report.headline 'c2_asapp' not among its methods"):
        check_report("asap_table1", experiment)


def test_without_a_printed_value_the_headline_is_the_first_value():
    section = _section()
    section["table"]["rows"][2]["cells"][1] = _cell(80.0)
    headline = summary_rows([section])[0]["headline"]
    assert (headline["metric"], headline["ours"], headline["delta"]) == ("recall@1", 70.0, None)


def test_table_less_sections_and_not_run_experiments():
    figure = {"experiment": "pfml_fig2", "title": "PFML Fig. 2", "table": None, "figures": [{"file": "a.png"}] * 2}
    rows = summary_rows([figure], [{"experiment": "pfml_table1_sop", "reason": "SOP not prepared"}])
    assert rows == [
        {"experiment": "pfml_fig2", "title": "PFML Fig. 2", "shows": "2 figures"},
        {"experiment": "pfml_table1_sop", "title": "pfml_table1_sop", "not_run": "SOP not prepared"},
    ]
    published = _section("rsw_table5")
    published["table"]["rows"] = [r for r in published["table"]["rows"] if r["source"] == "paper"]
    assert summary_rows([published])[0]["shows"] == "the paper's numbers alone"  # not "no value of ours"
    with pytest.raises(ValueError, match="expected keys 'experiment' and 'reason'"):
        summary_rows([], [{"experiment": "x"}])


def test_the_page_leads_with_the_summary(tmp_path):
    html = tmp_path / "index.html"
    render_report(
        [_section(), _section("pfml_table1_ibn")],
        [tmp_path, tmp_path],
        provenance(ROOT, [], {}),
        html,
        TEMPLATES,
        not_run=[{"experiment": "pfml_table1_sop", "reason": "SOP is not prepared (dmlrepro prepare sop)"}],
    )
    text = html.read_text()
    summary = text.index('<section id="summary">')
    assert summary < text.index('<section id="pfml_table1">') < text.index('<section id="provenance">')
    table = text[summary : text.index("</section>", summary)]
    assert table.count('<a href="#pfml_table1">') == 1 and table.count('<a href="#pfml_table1_ibn">') == 1
    assert "<td>83.0</td>" in table and "<td>-3.00</td>" in table and "<td>1/2</td>" in table
    assert "<th>ours</th><th>over untrained</th><th>paper</th>" in table
    assert "<td>80.00 ± 0.40</td>\n<td>+30.0</td>\n<td>83.0</td>" in table  # R@2 80 over its untrained 50
    assert '<td class="label"><span class="off">✗</span></td>' in table  # |Δ| = 3 outside: PFML R@2's verdict
    assert "not run — SOP is not prepared (dmlrepro prepare sop)" in table
    nav = text[text.index("<nav>") : text.index("</nav>")]
    assert nav.count("<a ") == 2  # Summary, Provenance: the sections are linked from the summary, not from here


def test_the_summary_is_on_the_first_screen_and_nothing_is_cut_off(chromium, tmp_path):
    """A report the embedded default's size (45 sections, the Claims with a not-testable claim naming long
    failing checks) in a 1,400 px window: the summary table starts on the first screen; nothing overflows."""
    from dmlrepro.report.browser import check_report
    from dmlrepro.report.claims import claims_section, load_catalogue, load_check_ranges

    catalogue = ROOT / "config" / "claims.yaml"
    claims = claims_section(
        load_catalogue(catalogue), "miniature", {}, ROOT / "config" / "reported", load_check_ranges(catalogue)
    )
    claims["claims"][0].update(
        verdict="not testable at this scale",
        test_verdict="holds",
        failing_checks=["beats_untrained (Proxy Anchor, CUB-200-2011): R@1 +0.4 over epoch 0, expected > +2 " * 4] * 3,
    )
    sections = [_section(f"experiment_{i}") for i in range(45)]
    html = tmp_path / "index.html"
    render_report(sections, [tmp_path] * 45, provenance(ROOT, [], {}), html, TEMPLATES, claims=claims)
    result = check_report(html, width=1400)
    assert result["broken"] == result["console_errors"] == result["overflowing"] == [], result
    assert result["first_table"]["in"] == "<table> in #summary"
    assert result["first_table"]["top"] < result["window"][1], result  # on the first screen
