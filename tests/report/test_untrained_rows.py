"""The untrained row of the report's tables (report.section_data.add_untrained_rows): each run's
evaluation before training (metrics.json untrained_metrics), one row per starting network, above our
rows, and every cell of ours with how much training added."""

from pathlib import Path

import pytest

from dmlrepro.report import provenance, render_report
from dmlrepro.report.aggregate import aggregate_runs
from dmlrepro.report.section_data import UNTRAINED_LABEL
from dmlrepro.report.sections import build_section

ROOT = Path(__file__).resolve().parents[2]


def _records(untrained):
    """Per method: R@1 after training per seed and, per seed, the untrained R@1 (None: not recorded)."""
    trained = {"pfml": [0.40, 0.44], "proxy_anchor": [0.50, 0.52], "hist": [0.30, 0.32]}
    return [
        {
            "method": m,
            "dataset": "synthetic",
            "sweep": {},
            "seed": s,
            "result": {
                "status": "completed",
                "metrics": {"recall@1": v, "recall@2": v + 0.1},
                "untrained_metrics": None
                if untrained[m] is None
                else {"recall@1": untrained[m][s], "recall@2": untrained[m][s] + 0.1},
            },
        }
        for m, values in trained.items()
        for s, v in enumerate(values)
    ]


EXPERIMENT = {
    "methods": ["pfml", "proxy_anchor", "hist"],
    "datasets": ["synthetic"],
    "metrics": ["recall@1", "recall@2"],
    "report": {
        "methods": {"pfml": "Potential Field (Ours)", "proxy_anchor": "Proxy Anchor"},
        "datasets": {"synthetic": "CUB-200-2011"},
    },
}


def _table(tmp_path, untrained):
    aggregated = aggregate_runs(_records(untrained), ["recall@1", "recall@2"])
    section = build_section(
        "t1", EXPERIMENT, aggregated, [], tmp_path / "s", reported_dir=ROOT / "config" / "reported", method_configs={}
    )
    return section, section["table"]


def test_one_untrained_row_for_one_starting_network_with_the_gains(tmp_path):
    same = [0.20, 0.22]
    _, table = _table(tmp_path, {"pfml": same, "proxy_anchor": same, "hist": same})
    labels = [row["label"] for row in table["rows"]]
    assert labels == [UNTRAINED_LABEL, "Potential Field (Ours)", "Proxy Anchor", "hist"]
    untrained = table["rows"][0]
    assert untrained["source"] == "untrained"
    assert untrained["cells"][0]["ours"] == pytest.approx(21.0) and untrained["cells"][0]["ours_std"] == pytest.approx(
        1.4142135, rel=1e-6
    )  # mean ± sample std of 20, 22 (%)
    pfml = table["rows"][1]["cells"][0]
    assert pfml["ours"] == pytest.approx(42.0) and pfml["gain"] == pytest.approx(21.0)  # 42 − 21 points
    assert table["rows"][3]["cells"][0]["gain"] == pytest.approx(10.0)  # HIST: 31 − 21


def test_runs_that_start_from_another_network_get_their_own_row(tmp_path):
    # HIST's head differs (PFML Table 2's HIST preset): its untrained evaluation is its own
    _, table = _table(tmp_path, {"pfml": [0.20, 0.22], "proxy_anchor": [0.20, 0.22], "hist": [0.10, 0.12]})
    labels = [row["label"] for row in table["rows"]]
    assert labels[:2] == [f"{UNTRAINED_LABEL}: Potential Field (Ours), Proxy Anchor", f"{UNTRAINED_LABEL}: hist"]
    assert table["rows"][1]["cells"][0]["ours"] == pytest.approx(11.0)
    assert table["rows"][4]["cells"][0]["gain"] == pytest.approx(20.0)  # HIST: 31 − 11


def test_one_seed_tables_show_the_untrained_value(tmp_path):
    # one seed per cell: no spread anywhere, the untrained value alone (R@1 20 %, R@2 30 %), and the report prints it
    same = [0.20, 0.22]
    records = [r for r in _records({"pfml": same, "proxy_anchor": same, "hist": same}) if r["seed"] == 0]
    aggregated = aggregate_runs(records, ["recall@1", "recall@2"])
    section = build_section(
        "t1", EXPERIMENT, aggregated, [], tmp_path / "s", reported_dir=ROOT / "config" / "reported", method_configs={}
    )
    untrained = section["table"]["rows"][0]
    assert untrained["source"] == "untrained"
    assert [(c["ours"], c["ours_std"]) for c in untrained["cells"]] == [
        (pytest.approx(20.0), None),
        (pytest.approx(30.0), None),
    ]
    assert section["table"]["rows"][1]["cells"][0]["gain"] == pytest.approx(20.0)  # PFML: 40 − 20
    html = tmp_path / "index.html"
    render_report([section], [tmp_path / "s"], provenance(ROOT, [], {}), html, ROOT / "reports" / "templates")
    row = html.read_text().split(f'<tr class="untrained"><td class="label">{UNTRAINED_LABEL}</td>')[1].split("</tr>")[0]
    assert "20.00" in row and "30.00" in row


def test_no_untrained_evaluation_no_row(tmp_path):
    _, table = _table(tmp_path, {"pfml": None, "proxy_anchor": None, "hist": None})
    assert all(row["source"] != "untrained" for row in table["rows"])
    assert all("gain" not in cell for row in table["rows"] for cell in row["cells"])


def test_the_report_shows_the_row_and_the_gain(tmp_path):
    section, _ = _table(tmp_path, {"pfml": [0.20, 0.22], "proxy_anchor": [0.20, 0.22], "hist": [0.20, 0.22]})
    html = tmp_path / "index.html"
    render_report([section], [tmp_path / "s"], provenance(ROOT, [], {}), html, ROOT / "reports" / "templates")
    text = html.read_text()
    assert f'<tr class="untrained"><td class="label">{UNTRAINED_LABEL}</td>' in text
    assert "21.00 ± 1.41" in text and '42.00 ± 2.83 <span class="status">(+21.0 over epoch 0)</span>' in text
