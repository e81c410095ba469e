"""The report's provenance: a preflight's projected hours beside the measured ones, per table
(dmlrepro.report.provenance.projected_hours, reports/templates/index.html.j2)."""

import json
from pathlib import Path

from dmlrepro.report.html import render_report
from dmlrepro.report.provenance import provenance

REPO = Path(__file__).resolve().parents[2]
RUNS = [
    {
        "run_id": "pfml-cub200-resnet50-s0-0123456789",
        "method": "pfml",
        "dataset": "cub200",
        "seed": 0,
        "status": "completed",
        "device": "cuda",
        "epochs": 200,
        "train_hours": 0.5,
    }
]


def page(tmp_path, preflight=None):
    prov = provenance(REPO, RUNS, {"pfml_table1": [RUNS[0]["run_id"]]}, preflight)
    out = tmp_path / "report" / "index.html"
    render_report([], [], prov, out, REPO / "reports/templates")
    return prov, out.read_text()


def test_projected_hours_stand_beside_the_measured_ones(tmp_path):
    path = tmp_path / "preflight.json"
    path.write_text(
        json.dumps(
            {
                "device": {"name": "NVIDIA H100", "device": "cuda"},
                "configs": [],
                "experiments": [{"name": "pfml_table1", "runs": [RUNS[0]["run_id"]], "hours": 0.875}],
                "total_hours": 0.875,
                "over_budget": [],
            }
        )
    )
    prov, html = page(tmp_path, path)
    assert prov["projected_hours_per_experiment"] == {"pfml_table1": 0.875}
    assert "projected hours (preflight on NVIDIA H100 (cuda))" in html
    assert '<td class="label">pfml_table1</td><td>0.5000</td><td>0.88</td>' in html


def test_without_a_preflight_the_table_is_as_before(tmp_path):
    prov, html = page(tmp_path, tmp_path / "missing.json")
    assert "projected_hours_per_experiment" not in prov
    assert "projected hours" not in html and '<td class="label">pfml_table1</td><td>0.5000</td></tr>' in html
