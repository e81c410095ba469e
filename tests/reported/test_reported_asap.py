"""Checks for the transcribed ASAP DML paper numbers in config/reported/asap_*.csv.

Paper: "ASAP DML: Deep Metric Learning with Alternating Sets of Alternating Proxies"
(anonymous, under review).  Spot-check values below were read directly from the
paper text (Tables 1-3, Sec. 5.2 and App. A.3.3), not copied from the CSVs.  Values are
compared as strings, because the CSVs keep numbers exactly as printed (e.g. "23.50").
"""

import pandas as pd
import pytest

from .reported_csv import cell, check, check_format, csvs, load, spot_cases

DATASETS = {"CUB-200-2011", "Cars-196", "SOP", "In-Shop", "MNIST", ""}
BLOCKS = {"Concatenated (512-dim)": "512", "Separated (128-dim)": "128"}

# The 13 printed rows of Tables 1-3, in printed order.  The SoftTriple row is printed as
# "SoftTriple-S/L" (Table 1), "SoftTriple-S" (Table 2, SOP/InShop), "SoftTriple-L" (Table 3).
METHODS = [
    "C1",
    "C1-XBM-L",
    "C1-ASAP-L",
    "C2",
    "C2-XBM-L",
    "C2-ASAP-L",
    "MS",
    "MS-ASAP-L",
    "Triplet",
    "Triplet-ASAP-L",
    "ProxyAnchor",
    "ProxyNCA++",
]

# Expected rows = printed numbers.  No table has a "-" cell and none prints a ± value.
EXPECTED_ROWS = {
    # Table 1: 13 methods x 4 datasets (SOP, InShop, CUB, Cars196) x {512D, 128D} x {P@1, MAP@R}
    "asap_table1": 13 * 4 * 2 * 2,  # 208
    # Table 2: 13 methods x 2 datasets (SOP, InShop) x {512D, 128D} x {P@1, P@R, MAP@R}
    "asap_table2": 13 * 2 * 2 * 3,  # 156
    # Table 3: 13 methods x 2 datasets (CUB, Cars196) x {512D, 128D} x {P@1, P@R, MAP@R}
    "asap_table3": 13 * 2 * 2 * 3,  # 156
    # Sec. 5.2: MNIST MAP@R, sample-based 98.06 vs proxy-based 97.21
    "asap_mnist": 2,
    # Sec. 5.2 (Fig. 2): lambda interval [10^-1, 10^-5] (2), selected lambda 2e-4, #proxy=8, b=12
    "asap_fig2": 5,
    # App. A.3.3: 5-10 ms (2), 105, 97 ms/batch, 200-400 ms (2), 40-45 mb (2), 16.6 mb, 5.9 mb, 75 kb
    "asap_cost_profile": 11,
}

C512, S128 = "Concatenated (512-dim)", "Separated (128-dim)"
CUB, CARS = "CUB-200-2011", "Cars-196"
BMDM = ("block", "method", "dataset", "metric")

# Spot values read from the paper: key column values, then the printed value (no ± anywhere).
SPOTS = spot_cases(
    [
        (
            "asap_table1",
            BMDM,
            [
                (C512, "C2-ASAP-L", "SOP", "precision@1", "78.95"),
                (C512, "MS-ASAP-L", "In-Shop", "map@r", "63.59"),
                (S128, "SoftTriple-S/L", CARS, "map@r", "19.18"),
                (C512, "C1", CARS, "map@r", "23.50"),
                (S128, "Triplet", CUB, "precision@1", "55.51"),
                (S128, "C1-ASAP-L", "In-Shop", "precision@1", "85.50"),
            ],
        ),
        (
            "asap_table2",
            BMDM,
            [
                (C512, "C1", "SOP", "r_precision", "43.28"),
                (C512, "Triplet-ASAP-L", "In-Shop", "r_precision", "67.23"),
                (S128, "SoftTriple-S", "In-Shop", "map@r", "55.68"),
                (S128, "C2-XBM-L", "SOP", "r_precision", "48.18"),
                (C512, "MS-ASAP-L", "In-Shop", "precision@1", "90.24"),
            ],
        ),
        (
            "asap_table3",
            BMDM,
            [
                (S128, "ProxyNCA++", CARS, "r_precision", "29.91"),
                (S128, "ProxyAnchor", CARS, "r_precision", "29.91"),
                (C512, "C2-ASAP-L", CUB, "map@r", "28.02"),
                (C512, "MS-ASAP-L", CARS, "precision@1", "86.26"),
                (S128, "C1", CARS, "r_precision", "26.50"),
                (C512, "SoftTriple-L", CUB, "r_precision", "34.99"),
            ],
        ),
        (
            "asap_mnist",
            ("method", "dataset", "metric"),
            [
                ("sample-based", "MNIST", "map@r", "98.06"),
                ("proxy-based", "MNIST", "map@r", "97.21"),
            ],
        ),
        (
            "asap_fig2",
            ("metric",),
            [
                ("lambda_good_interval_high", "1e-1"),
                ("lambda_good_interval_low", "1e-5"),
                ("lambda_selected", "2e-4"),
                ("proxies_per_class_selected", "8"),
                ("pool_size_selected", "12"),
            ],
        ),
        (
            "asap_cost_profile",
            ("method", "metric"),
            [
                ("Contrastive-ASAP", "ms_per_batch", "105"),
                ("vanilla", "ms_per_batch", "97"),
            ],
        ),
        (
            "asap_cost_profile",
            ("dataset", "metric"),
            [
                ("SOP", "proxy_memory_mb", "16.6"),
                ("In-Shop", "proxy_memory_mb", "5.9"),
            ],
        ),
        (
            "asap_cost_profile",
            ("metric",),
            [
                ("proxy_memory_kb", "75"),
            ],
        ),
    ]
)


# ----------------------------------------------------------------- format


def test_all_expected_asap_files_present():
    assert {p.stem for p in csvs("asap")} == set(EXPECTED_ROWS)


@pytest.mark.parametrize("path", csvs("asap"), ids=lambda p: p.name)
def test_format(path):
    # the paper prints no ± values, and only author-year citations (none in the tables)
    check_format(
        path,
        datasets=DATASETS,
        std=False,
        citation=False,
        source_prefix="ASAP DML: Deep Metric Learning with Alternating Sets of Alternating Proxies, ",
    )


@pytest.mark.parametrize("name,n", sorted(EXPECTED_ROWS.items()))
def test_row_counts(name, n):
    assert len(load(name)) == n


@pytest.mark.parametrize(
    "name,datasets,metrics,softtriple",
    [
        ("asap_table1", {"SOP", "In-Shop", CUB, CARS}, {"precision@1", "map@r"}, "SoftTriple-S/L"),
        ("asap_table2", {"SOP", "In-Shop"}, {"precision@1", "r_precision", "map@r"}, "SoftTriple-S"),
        ("asap_table3", {CUB, CARS}, {"precision@1", "r_precision", "map@r"}, "SoftTriple-L"),
    ],
)
def test_main_table_layout(name, datasets, metrics, softtriple):
    df = load(name)
    assert list(dict.fromkeys(df.method)) == METHODS + [softtriple]
    assert set(df.dataset) == datasets and set(df.metric) == metrics
    assert (df.backbone == "BN-Inception").all()
    assert (df.block.map(BLOCKS) == df.embedding_dim).all()
    # every method has a full row (no '-' cells)
    assert (df.groupby("method").size() == len(datasets) * 2 * len(metrics)).all()


def test_table1_equals_p1_mapr_of_tables_2_and_3():
    t1 = load("asap_table1")
    t23 = pd.concat([load("asap_table2"), load("asap_table3")])
    t23["method"] = t23.method.replace({"SoftTriple-S": "SoftTriple-S/L", "SoftTriple-L": "SoftTriple-S/L"})
    key = ["block", "method", "dataset", "metric"]
    m = t1.merge(t23, on=key, how="left", suffixes=("", "_23"))
    assert (m.value == m.value_23).all()


# ----------------------------------------------------------------- spot checks (read from the paper)


@pytest.mark.parametrize("name,value,std,where", SPOTS)
def test_spot(name, value, std, where):
    check(load(name), value, std, **where)


def test_mnist_setup():
    df = load("asap_mnist")
    assert set(df.embedding_dim) == {"2"} and set(df.backbone) == {"ResNetV2-20"}


def test_fig2_setup():
    df = load("asap_fig2")
    assert set(df.dataset) == {CUB} and set(df.method) == {"C2-ASAP"}


def test_cost_profile_ranges():
    df = load("asap_cost_profile")
    pairs = {m: cell(df, metric=m).value for m in df.metric if m.endswith(("_low", "_high"))}
    assert pairs == {
        "step_overhead_ms_low": "5",
        "step_overhead_ms_high": "10",
        "alternation_overhead_ms_low": "200",
        "alternation_overhead_ms_high": "400",
        "model_memory_mb_low": "40",
        "model_memory_mb_high": "45",
    }
