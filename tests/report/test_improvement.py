"""Report kind `improvement` (ASAP Fig. 5, ASAP-R22): a metric per method and its improvement over the
method's base loss, absolute and in %, drawn as grouped bars; config validation of report.base."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dmlrepro.report.section_data import check_improvement, improvement_rows
from dmlrepro.report.sections import build_section

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METHODS = ["c2", "c2_asap_s", "c2_asap", "ms", "ms_asap", "soft_triple"]
BASE = {"c2_asap_s": "c2", "c2_asap": "c2", "ms_asap": "ms"}


def _frame():
    """map@r@separated (fractions, as aggregated) on two datasets; ms_asap has no sop run."""
    values = {
        ("c2", "inshop"): 0.20,
        ("c2_asap_s", "inshop"): 0.25,
        ("c2_asap", "inshop"): 0.19,
        ("ms", "inshop"): 0.40,
        ("ms_asap", "inshop"): 0.42,
        ("soft_triple", "inshop"): 0.30,
        ("c2", "sop"): 0.50,
        ("c2_asap_s", "sop"): 0.55,
        ("c2_asap", "sop"): 0.60,
        ("ms", "sop"): 0.45,
        ("soft_triple", "sop"): 0.35,
    }
    return pd.DataFrame(
        [
            {
                "method": m,
                "dataset": d,
                "sweep": "",
                "map@r@separated_mean": v,
                "map@r@separated_std": 0.01,
                "map@r@separated_ci95": 0.02,
                "seeds": 1,
                "diverged": 0,
            }
            for (m, d), v in values.items()
        ]
    )


def _experiment(**report):
    return {
        "methods": METHODS,
        "datasets": ["inshop", "sop"],
        "metrics": ["map@r@separated"],
        "report": {
            "kind": "improvement",
            "mlrc": True,
            "metric": "map@r@separated",
            "base": BASE,
            "methods": {"c2": "C2", "c2_asap_s": "C2-ASAP-S", "c2_asap": "C2-ASAP-L"},
            "datasets": {"inshop": "In-Shop", "sop": "SOP"},
            **report,
        },
    }


def test_improvement_numbers_by_hand():
    rows = improvement_rows(_frame(), "map@r@separated", BASE, METHODS, {"c2_asap_s": "C2-ASAP-S"})
    by = {(r["method"], r["dataset"]): r for r in rows}
    # MAP@R in paper units (%): C2-ASAP-S on In-Shop 25 vs C2 20: +5 points, +25 % of the base
    r = by[("c2_asap_s", "inshop")]
    assert r["label"] == "C2-ASAP-S" and r["base"] == "c2" and r["role"] == "variant"
    assert r["value"] == pytest.approx(25.0) and r["base_value"] == pytest.approx(20.0)
    assert r["delta"] == pytest.approx(5.0) and r["delta_pct"] == pytest.approx(25.0)
    # a variant below its base: 19 − 20 = −1 point = −5 %
    assert by[("c2_asap", "inshop")]["delta"] == pytest.approx(-1.0)
    assert by[("c2_asap", "inshop")]["delta_pct"] == pytest.approx(-5.0)
    # SOP: 60 − 50 = +10 points = +20 %; 55 − 50 = +5 = +10 %
    assert by[("c2_asap", "sop")]["delta"] == pytest.approx(10.0)
    assert by[("c2_asap", "sop")]["delta_pct"] == pytest.approx(20.0)
    assert by[("c2_asap_s", "sop")]["delta_pct"] == pytest.approx(10.0)
    # MS-ASAP on In-Shop: 42 − 40 = 2 points = 5 %
    assert by[("ms_asap", "inshop")]["delta"] == pytest.approx(2.0)
    assert by[("ms_asap", "inshop")]["delta_pct"] == pytest.approx(5.0)
    # bases and methods without a base carry no Δ; a missing run is no row
    assert by[("c2", "inshop")]["role"] == "base" and by[("c2", "inshop")]["delta"] is None
    assert by[("soft_triple", "sop")]["role"] == "alone" and by[("soft_triple", "sop")]["delta"] is None
    assert ("ms_asap", "sop") not in by and by[("ms", "sop")]["role"] == "base"
    # grouped by base loss: the base first, then its variants in declared order; loners last
    assert [r["method"] for r in rows if r["dataset"] == "inshop"] == [
        "c2",
        "c2_asap_s",
        "c2_asap",
        "ms",
        "ms_asap",
        "soft_triple",
    ]


def test_a_missing_or_zero_base_gives_no_delta():
    frame = _frame()
    frame = frame[~((frame["method"] == "c2") & (frame["dataset"] == "sop"))]
    frame.loc[(frame["method"] == "ms") & (frame["dataset"] == "inshop"), "map@r@separated_mean"] = 0.0
    by = {(r["method"], r["dataset"]): r for r in improvement_rows(frame, "map@r@separated", BASE, METHODS, {})}
    assert by[("c2", "sop")]["value"] is None  # the base's bar is kept (empty) beside its variants
    assert by[("c2_asap", "sop")]["delta"] is None and by[("c2_asap", "sop")]["delta_pct"] is None
    assert by[("ms_asap", "inshop")]["delta"] == pytest.approx(42.0) and by[("ms_asap", "inshop")]["delta_pct"] is None


def test_section_writes_the_table_the_rows_and_a_png(tmp_path):
    section = build_section("fig5", _experiment(), _frame(), [], tmp_path, reported_dir=tmp_path, method_configs={})
    assert section["kind"] == "improvement"
    assert section["table"] is not None and {c["dataset"] for c in section["table"]["columns"]} == {"In-Shop", "SOP"}
    assert len(section["improvements"]) == 11
    [figure] = section["figures"]
    data = (tmp_path / figure["file"]).read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    from PIL import Image

    with Image.open(tmp_path / figure["file"]) as image:
        image.verify()
    saved = json.loads((tmp_path / "section.json").read_text())
    assert saved["improvements"][1]["delta"] == pytest.approx(5.0)


def test_the_report_template_renders_the_improvements(tmp_path):
    from pathlib import Path

    from dmlrepro.report.html import render_report

    section = build_section(
        "fig5", _experiment(), _frame(), [], tmp_path / "s", reported_dir=tmp_path, method_configs={}
    )
    templates = Path(__file__).resolve().parents[2] / "reports" / "templates"

    class Provenance(dict):  # the fields this section does not use are empty
        def __missing__(self, key):
            return ""

    provenance = Provenance(total_hours=0.0, packages={}, hours_per_experiment={}, runs=[])
    render_report([section], [tmp_path / "s"], provenance, tmp_path / "out" / "index.html", templates)
    html = (tmp_path / "out" / "index.html").read_text()
    assert "Δ (% of base)" in html and "+25.0" in html and "+5.00" in html


def test_metric_defaults_to_the_first_metric():
    experiment = _experiment()
    del experiment["report"]["metric"]
    assert check_improvement("fig5", experiment) == ("map@r@separated", BASE)


@pytest.mark.parametrize(
    "base, match",
    [
        ({"c2_xbm": "c2"}, r"experiments\.fig5\.report\.base: 'c2_xbm' is not one of the experiment's methods"),
        ({"c2_asap": "c1"}, r"experiments\.fig5\.report\.base\.c2_asap = 'c1': the base method is not one"),
        ({"c2": "c2"}, r"experiments\.fig5\.report\.base\.c2: a method is not its own base"),
        ({}, r"experiments\.fig5\.report\.base = \{\}"),
        (None, r"experiments\.fig5\.report\.base = None"),
    ],
)
def test_bad_base_raises_naming_the_key(tmp_path, base, match):
    experiment = _experiment(base=base)
    with pytest.raises(ValueError, match=match):
        check_improvement("fig5", experiment)
    with pytest.raises(ValueError, match=r"experiments\.fig5\.report\.base"):
        build_section("fig5", experiment, _frame(), [], tmp_path, reported_dir=tmp_path, method_configs={})


def test_unknown_metric_raises_naming_the_key():
    with pytest.raises(ValueError, match=r"experiments\.fig5\.report\.metric = 'map@r'"):
        check_improvement("fig5", _experiment(metric="map@r"))


@pytest.mark.parametrize("config", ["config.yaml", "paper.yaml"])
def test_both_configs_fig5_blocks_validate(config):
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    experiment = yaml.safe_load((root / "config" / config).read_text())["experiments"]["asap_fig5_s_vs_l"]
    assert experiment["report"]["kind"] == "improvement"
    metric, base = check_improvement("asap_fig5_s_vs_l", experiment)
    assert metric == ("map@r@separated" if config == "paper.yaml" else "map@r")
    assert "read them off" not in experiment["report"]["paper_says"]
