"""Paper-vs-reproduced cells: Δ, the combined σ and the verdict, computed by hand."""

import math

import pandas as pd
import pytest

from dmlrepro.report.compare import comparison_table, verdict
from dmlrepro.report.reported import load_reported, paper_units


def test_verdict_by_hand():
    delta, sigma, within = verdict(64.9, 0.3, 63.0, 0.4)
    assert delta == pytest.approx(-1.9) and sigma == pytest.approx(0.5) and within is False  # 1.9 > 2 × 0.5
    assert verdict(64.9, 0.3, 64.1, 0.4)[2] is True  # 0.8 <= 1.0
    assert verdict(64.9, None, 64.1, None) == (pytest.approx(-0.8), None, None)  # no σ: no verdict
    assert verdict(None, 0.3, 64.1, 0.4) == (None, None, None)


def test_percent_units():
    assert paper_units("recall@1", 0.5) == 50.0 and paper_units("map@r", 0.25) == 25.0
    assert paper_units("w2", 0.5) == 0.5 and paper_units("seconds_per_epoch", 14.2) == 14.2


def _reported(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame(
        [
            ["t", "", "Lit", "CUB-200-2011", "recall@1", "60.0", ""],
            ["t", "", "Ours", "CUB-200-2011", "recall@1", "64.9", "0.3"],
            ["t", "", "Ours", "Cars-196", "recall@1", "84.0", "0.2"],
        ],
        columns=["table", "block", "method", "dataset", "metric", "value", "std"],
    ).to_csv(path, index=False)
    return load_reported(path)


def _aggregated(dataset):
    return pd.DataFrame(
        [
            {
                "method": "pfml",
                "dataset": dataset,
                "sweep": float("nan"),
                "recall@1_mean": 0.63,
                "recall@1_std": 0.004,
                "seeds": 5,
                "diverged": 0,
            }
        ]
    )


def test_real_dataset_gets_delta(tmp_path):
    table = comparison_table(
        _aggregated("cub200"), _reported(tmp_path), ["recall@1"], {"pfml": "Ours"}, {"cub200": "CUB-200-2011"}, 5
    )
    literature, ours = table["rows"]
    assert literature["label"] == "Lit" and literature["cells"][0]["paper"] == 60.0 and literature["source"] == "paper"
    cell = ours["cells"][0]
    assert cell["ours"] == pytest.approx(63.0) and cell["ours_std"] == pytest.approx(0.4)
    assert cell["delta"] == pytest.approx(-1.9) and cell["within"] is False
    assert ours["status"] == "5/5 seeds"


def test_stand_in_dataset_is_shown_not_compared(tmp_path):
    table = comparison_table(
        _aggregated("synthetic"), _reported(tmp_path), ["recall@1"], {"pfml": "Ours"}, {"synthetic": "CUB-200-2011"}, 5
    )
    assert table["columns"][0]["stand_in"] is True
    cell = table["rows"][1]["cells"][0]
    assert cell["paper"] == 64.9 and cell["ours"] == pytest.approx(63.0) and cell["delta"] is None


def test_mnist_datasets_are_the_printed_ones_and_digits_a_stand_in():
    from dmlrepro.report.reported import is_stand_in

    assert not is_stand_in("mnist", "MNIST") and not is_stand_in("fashion_mnist", "FashionMNIST")
    assert is_stand_in("digits", "MNIST") and is_stand_in("mnist", "FashionMNIST")


def test_diverged_and_missing_seeds_are_shown(tmp_path):
    aggregated = _aggregated("cub200").assign(seeds=5, diverged=2)
    aggregated.loc[0, "recall@1_mean"] = math.nan
    table = comparison_table(aggregated, None, ["recall@1"], {}, {"cub200": "CUB-200-2011"}, 5)
    row = table["rows"][0]
    assert row["label"] == "pfml" and row["status"] == "3/5 seeds, 2 diverged" and row["cells"][0]["ours"] is None


def test_one_row_per_method_across_datasets(tmp_path):
    aggregated = pd.concat([_aggregated("cub200"), _aggregated("cars196").assign(**{"recall@1_mean": 0.85})])
    table = comparison_table(
        aggregated,
        _reported(tmp_path),
        ["recall@1"],
        {"pfml": "Ours"},
        {"cub200": "CUB-200-2011", "cars196": "Cars-196"},
        5,
    )
    ours = [r for r in table["rows"] if r["source"] == "ours"]
    assert len(ours) == 1
    cub, cars = ours[0]["cells"]
    assert cub["delta"] == pytest.approx(-1.9) and cars["delta"] == pytest.approx(1.0)


def test_mlrc_tables_compare_95_percent_confidence_intervals(tmp_path):
    """uncertainty="ci95": ours ± its 95 % CI, within when |Δ| ≤ √(CI_paper² + CI_ours²) (factor 1, not 2)."""
    aggregated = _aggregated("cub200").assign(**{"recall@1_ci95": 0.012})  # 1.2 points; std 0.4
    table = comparison_table(
        aggregated,
        _reported(tmp_path),
        ["recall@1"],
        {"pfml": "Ours"},
        {"cub200": "CUB-200-2011"},
        5,
        uncertainty="ci95",
    )
    cell = table["rows"][1]["cells"][0]
    assert cell["ours_std"] == pytest.approx(1.2) and cell["sigma"] == pytest.approx(math.hypot(0.3, 1.2))
    assert cell["within"] is False  # 1.9 > 1.237
    wide = aggregated.assign(**{"recall@1_ci95": 0.02})
    cell = comparison_table(
        wide, _reported(tmp_path), ["recall@1"], {"pfml": "Ours"}, {"cub200": "CUB-200-2011"}, 5, uncertainty="ci95"
    )["rows"][1]["cells"][0]
    assert cell["within"] is True  # 1.9 <= √(0.3² + 2²) = 2.02
    assert table["uncertainty"] == "ci95"
    with pytest.raises(ValueError, match="uncertainty"):
        comparison_table(aggregated, None, ["recall@1"], {}, {}, 5, uncertainty="sem")
