"""A comparison table wider than report.html.MAX_COLUMNS is drawn as several tables (report.html.table_blocks):
datasets kept whole where they fit, a wider dataset split evenly, each block's header naming the datasets of
its own columns in their order, a printed row only where the paper prints a value of the block; at 1,400 px
nothing of ASAP Table 1's 16 MLRC columns is cut off."""

from pathlib import Path

import pytest

from dmlrepro.report import provenance, render_report
from dmlrepro.report.html import table_blocks

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "reports" / "templates"
MLRC = ["precision@1@concatenated", "map@r@concatenated", "precision@1@separated", "map@r@separated"]


def _table(datasets: dict[str, str], metrics: list[str]) -> dict:
    """A table over `datasets` (ours -> printed) × `metrics`: a paper row printing only the first dataset, an
    untrained row, and one row of ours with a gain and the paper's value in every cell."""
    columns = [
        {"dataset": printed, "ours_dataset": ours, "metric": m, "stand_in": False}
        for ours, printed in datasets.items()
        for m in metrics
    ]
    first = columns[0]["ours_dataset"]

    def paper(c, value):
        return {"paper": value, "paper_std": None, "paper_text": f"{value}" if c["ours_dataset"] == first else None}

    blank = {"ours": None, "ours_std": None, "delta": None, "sigma": None, "within": None}
    rows = [
        {
            "label": "Proxy Anchor",
            "source": "paper",
            "status": "",
            "cells": [{**paper(c, 61.5), **blank} for c in columns],
        },
        {
            "label": "untrained (epoch 0)",
            "source": "untrained",
            "status": "before training",
            "cells": [{**paper(c, None), **blank, "ours": 41.25, "ours_std": 2.0} for c in columns],
        },
        {
            "label": "C2-ASAP",
            "source": "ours",
            "status": "5/5 seeds",
            "cells": [
                {
                    "paper": 69.73,
                    "paper_std": 0.21,
                    "paper_text": "69.73",
                    "ours": 67.89,
                    "ours_std": 2.34,
                    "delta": -1.84,
                    "sigma": 2.35,
                    "within": True,
                    "gain": 26.64,
                }
                for _ in columns
            ],
        },
    ]
    return {"columns": columns, "rows": rows, "uncertainty": "ci95"}


FOUR = {"cub200": "CUB-200-2011", "cars196": "Cars-196", "inshop": "In-Shop", "sop": "SOP"}


def test_datasets_stay_whole_where_they_fit():
    blocks = table_blocks(_table(FOUR, MLRC))  # 16 columns: CUB + Cars, In-Shop + SOP
    assert [b["index"] for b in blocks] == [list(range(8)), list(range(8, 16))]
    assert [[(g["dataset"], g["span"]) for g in b["groups"]] for b in blocks] == [
        [("CUB-200-2011", 4), ("Cars-196", 4)],
        [("In-Shop", 4), ("SOP", 4)],
    ]
    # the paper row prints CUB only: it is in the first block, not the second
    assert [[r["label"] for r in b["rows"]] for b in blocks] == [
        ["Proxy Anchor", "untrained (epoch 0)", "C2-ASAP"],
        ["untrained (epoch 0)", "C2-ASAP"],
    ]


@pytest.mark.parametrize(
    "datasets, metrics, sizes",
    [
        ({"cub200": "CUB-200-2011"}, [f"recall@1@c{i}" for i in range(10)], [5, 5]),  # RSW Table IV: one dataset
        ({"cub200": "CUB-200-2011"}, [f"m{i}" for i in range(9)], [5, 4]),  # RSW Table VI
        ({"cub200": "CUB-200-2011", "cars196": "Cars-196"}, [f"m{i}" for i in range(6)], [6, 6]),  # ASAP Table 2
        ({"cub200": "CUB-200-2011", "cars196": "Cars-196"}, ["recall@1", "recall@2", "recall@4", "recall@8"], [8]),
        ({"cub200": "CUB-200-2011"}, ["recall@1"], [1]),
    ],
)
def test_block_sizes(datasets, metrics, sizes):
    blocks = table_blocks(_table(datasets, metrics))
    assert [len(b["index"]) for b in blocks] == sizes
    assert [i for b in blocks for i in b["index"]] == list(range(len(datasets) * len(metrics)))  # each column once


def _render(tmp_path, table) -> str:
    section = {
        "experiment": "asap_table1",
        "title": "ASAP Table 1",
        "table": table,
        "figures": [],
        **dict.fromkeys(["description", "paper_says", "reported", "block"], ""),
        **dict.fromkeys(["notes", "readings", "ratios", "hparams", "runs"], []),
    }
    html = tmp_path / "index.html"
    render_report([section], [tmp_path], provenance(ROOT, [], {}), html, TEMPLATES)
    return html


def test_each_header_names_its_own_columns_dataset(tmp_path):
    # CUB before Cars as the columns are: a header sorted by name ("Cars-196" < "CUB-200-2011" ignoring case)
    # would print Cars-196 over CUB's numbers
    text = _render(tmp_path, _table({"cub200": "CUB-200-2011", "cars196": "Cars-196"}, ["recall@1"])).read_text()
    section = text[text.index('<section id="asap_table1">') :]
    assert section.index('<th colspan="1">CUB-200-2011') < section.index('<th colspan="1">Cars-196')
    assert "<th>recall@<wbr>1</th>" in section  # a metric name wraps after "@"


def test_asap_table1_fits_at_1400_px(chromium, tmp_path):
    from dmlrepro.report.browser import check_report

    result = check_report(_render(tmp_path, _table(FOUR, MLRC)), width=1400)
    assert result["overflowing"] == [] and result["console_errors"] == [], result
