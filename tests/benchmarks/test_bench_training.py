"""benchmarks/bench_training.py runs end to end at a tiny CPU size and reports every case.

No timing assertions: only that each case is present, names its anchor, and carries finite
positive numbers (throughput, epoch time, ratio, peak memory).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_training.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_training", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tiny_cpu_run_reports_every_case(tmp_path, capsys):
    out = tmp_path / "bench.json"
    # the CPU check size; smaller JPEGs, fewer warm-up steps and one worker keep it short
    _load().main(
        [
            "--device",
            "cpu",
            "--backbone",
            "tiny_cnn",
            "--image-size",
            "32",
            "--images",
            "400",
            "--steps",
            "5",
            "--warmup-steps",
            "1",
            "--workers",
            "1",
            "--jpeg-size",
            "96",
            "64",
            "--loader-epochs",
            "2",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())

    cases = {c["case"]: c for c in result["cases"]}
    assert list(cases) == [
        "pipeline_synthetic",
        "pipeline_real",
        "epoch_proxy_anchor",
        "epoch_pfml_m5",
        "epoch_pfml_m20",
        "epoch_pfml_m30",
        "loader_rebuilt",
        "loader_persistent",
    ]
    anchors = {
        "pipeline_synthetic": None,
        "pipeline_real": "pipeline_synthetic",
        "epoch_proxy_anchor": None,
        "epoch_pfml_m5": "epoch_proxy_anchor",
        "epoch_pfml_m20": "epoch_proxy_anchor",
        "epoch_pfml_m30": "epoch_proxy_anchor",
        "loader_rebuilt": None,
        "loader_persistent": "loader_rebuilt",
    }
    for name, case in cases.items():
        assert case["anchor"] == anchors[name]
        assert name in printed
        for key in ("images_per_s", "step_ms", "peak_mem_mib", "steps"):
            assert _positive(case[key]), (name, key, case[key])
        assert case["peak_mem_kind"] == "cpu_peak_rss"
        assert case["non_finite_steps"] == 0
        if case["anchor"] is not None:
            assert _positive(case["ratio_to_anchor"]), (name, case["ratio_to_anchor"])
        if case["measure"] == "epoch":
            assert _positive(case["epoch_s"]) and case["steps"] == 4  # 400 images / batch 100
            assert case["train_images"] == 400
    assert [cases[f"epoch_pfml_m{m}"]["proxies_per_class"] for m in (5, 20, 30)] == [5, 20, 30]
    assert cases["pipeline_real"]["proxies_per_class"] == 15
    for name in ("loader_rebuilt", "loader_persistent"):  # 2 epochs, each with an evaluation pass over 400 images
        assert len(cases[name]["epoch_times_s"]) == 2 and all(map(_positive, cases[name]["epoch_times_s"]))
        assert cases[name]["eval_images"] == 400
    assert result["meta"]["device"] == "cpu" and result["meta"]["images"] == 400
