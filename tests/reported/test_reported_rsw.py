"""Checks for the transcribed RSW paper tables (config/reported/rsw_table*.csv).

"Realigned Softmax Warping for Deep Metric Learning" (DeMoor & Prevost, arXiv:2408.15656),
Tables I-VIII.  Spot-check values below were read directly from the paper, not copied from
the CSVs.  Values are compared as strings,
because the CSVs keep numbers exactly as printed (e.g. "88.00", "63.0", "0.1").
"""

import pytest

from .reported_csv import cell, check, check_format, csvs, load, rows, spot_cases

METRICS = {
    "recall@1",
    "recall@2",
    "recall@4",
    "recall@10",
    "recall@100",
    "recall@1000",
    "nmi",
    "avg_dtp",
    "accuracy",
    "map@r",
    "r_precision",
    "precision@1",
}
DATASETS = {"CUB-200-2011", "Cars-196", "SOP", "LFW", "CFP-FP", "AgeDB-30", "CALFW", "CPLFW", ""}

# Expected number of rows = number of printed numbers (non-"-" cells) in each table,
# counted from the paper text; "-" cells have no row.
EXPECTED_ROWS = {
    # Table I: 23 method rows x 12 columns (CUB R@1/2/4/NMI, CARS R@1/2/4/NMI,
    # SOP R@1/10/100/1000) = 276, minus 49 '-' cells:
    #  top block (no header): ProxyNCA 3, Multi-Sim 2, N-Softmax 1, SoftTriple 1, BlackBox 5,
    #    Circle Loss 2, Proxy-Few 1, Proxy-Anchor I512 2, Proxy-Anchor R512 6 -> 108 - 23 = 85
    #  with a Validation Set: ProxyNCA++ 0, RS@K 5, Warped-Softmax 0 -> 36 - 5 = 31
    #  without a Validation Set: CE 2, CBML 0, IBC 1, HIST 1, *Contextual 2, Softmax (Eq. 4) 0,
    #    Warped-Softmax 0, ROADMAP 6, OSAP 6, *CCL 3, Warped-Softmax (†) 0 -> 132 - 21 = 111
    #  total 85 + 31 + 111 = 227.
    "rsw_table1": 227,
    # Table II: CUB, CARS (R@1/2/4/NMI) and SOP (R@1/10/100/1000), 3 x 4, all with ±.
    "rsw_table2": 12,
    # Table III: 9 function rows + 3 Eq. 7 warp rows, x 3 columns (R@1, NMI, AvgDTP).
    "rsw_table3": 36,
    # Table IV: 10 corruption rows (incl. Uncorrupted) x 4 methods.
    "rsw_table4": 40,
    # Table V: 7 methods x 5 benchmarks.
    "rsw_table5": 35,
    # Tables VI-VIII: methods x 9 columns (Complete/Ensemble/Aggregate x MAP@R/RP/P@1).
    "rsw_table6": 7 * 9,
    "rsw_table7": 7 * 9,
    "rsw_table8": 6 * 9,
}

SR = "Recent Methods with a Validation Set"
NOVAL = "Recent Methods without a Validation Set"


CUB, CARS = "CUB-200-2011", "Cars-196"
CO, EN, AG = "Complete (512-dim)", "Ensemble (512-dim)", "Aggregate (128-dim)"
BMDM = ("block", "method", "dataset", "metric")
BMM = ("block", "method", "metric")

# Spot values read from rsw.txt: key column values, then the cell as printed ("value" or "value ± std").
SPOTS = spot_cases(
    [
        (
            "rsw_table1",
            BMDM,
            [
                ("", "ProxyNCA", CUB, "recall@1", "49.2"),
                ("", "ProxyNCA", "SOP", "recall@1", "73.7"),
                ("", "Circle Loss", "SOP", "recall@1000", "98.6"),
                (SR, "RS@K", CARS, "recall@1", "80.7"),
                (SR, "Warped-Softmax", CARS, "nmi", "77.0"),
                (NOVAL, "HIST", CUB, "recall@1", "71.4"),
                (NOVAL, "Softmax (Eq. 4)", "SOP", "recall@1000", "98.8"),
                (NOVAL, "Warped-Softmax", CUB, "recall@1", "72.6"),
                (NOVAL, "Warped-Softmax †", CUB, "recall@1", "72.9"),
                (NOVAL, "Warped-Softmax †", CARS, "nmi", "79.0"),
                (NOVAL, "*CCL", CUB, "recall@1", "73.5"),
            ],
        ),
        # Proxy-Anchor appears twice in Table I (I512 and R512)
        (
            "rsw_table1",
            ("method", "backbone", "dataset", "metric"),
            [
                ("Proxy-Anchor", "ResNet-50", CUB, "recall@1", "69.7"),
                ("Proxy-Anchor", "BN-Inception", CUB, "recall@1", "68.4"),
            ],
        ),
        (
            "rsw_table2",
            ("dataset", "metric"),
            [
                (CUB, "recall@2", "81.5 ± 0.17"),
                (CARS, "nmi", "77.0 ± 0.32"),
                ("SOP", "recall@1000", "99.0 ± 0.02"),
                ("SOP", "recall@1", "81.6 ± 0.09"),
            ],
        ),
        (
            "rsw_table3",
            ("method", "metric"),
            [
                ("V0", "avg_dtp", "13.40"),
                ("V1", "recall@1", "63.2"),
                ("V3", "avg_dtp", "6.48"),
                ("V4", "avg_dtp", "17.20"),
                ("V6", "nmi", "26.3"),
                ("V8", "avg_dtp", "2.18"),
                ("W1", "recall@1", "18.6"),
                ("W3", "recall@1", "64.6"),
                ("W3", "avg_dtp", "7.76"),
            ],
        ),
        (
            "rsw_table4",
            BMM,
            [
                ("Uncorrupted", "Regular Softmax", "recall@1", "69.4"),
                ("Dropping Pixels: Cutout", "HIST", "recall@1", "64.5"),
                ("Geometric Distortions: Jigsaw", "ProxyNCA++", "recall@1", "45.7"),
                ("Additive Noise: Salt and Pepper", "ProxyNCA++", "recall@1", "33.8"),
                ("Blur: Defocus Blur", "Warped Softmax", "recall@1", "47.6"),
            ],
        ),
        (
            "rsw_table5",
            ("method", "dataset", "metric"),
            [
                ("Softmax (cos)", "CPLFW", "accuracy", "88.00"),
                ("Warped-Softmax", "CFP-FP", "accuracy", "98.66"),
                ("CosFace", "AgeDB-30", "accuracy", "98.32"),
                ("Softmax (Eq. 4)", "LFW", "accuracy", "99.55"),
            ],
        ),
        # Table VI (CUB)
        (
            "rsw_table6",
            BMM,
            [
                (CO, "Contrastive", "precision@1", "63.0 ± 0.63"),
                (AG, "Warped-Softmax", "precision@1", "62.4 ± 0.26"),
                (EN, "HIST", "r_precision", "37.44 ± 0.30"),
                (CO, "CosFace", "map@r", "26.89 ± 0.22"),
            ],
        ),
        # Table VII (Cars)
        (
            "rsw_table7",
            BMM,
            [
                (CO, "Multi-Sim.", "map@r", "15.01 ± 0.35"),
                (AG, "CosFace", "r_precision", "32.5 ± 0.22"),
                (EN, "PrAnchor", "map@r", "30.0 ± 0.27"),
                (CO, "Warped-Softmax", "precision@1", "87.79 ± 0.74"),
            ],
        ),
        # Table VIII (SOP)
        (
            "rsw_table8",
            BMM,
            [
                (CO, "PrAnchor", "precision@1", "58.75 ± 16.08"),
                (AG, "Arcface", "map@r", "41.93 ± 0.02"),
                (AG, "Warped-Sotmax", "map@r", "44.1 ± 0.16"),
                (AG, "PrNCA++", "precision@1", "72.52 ± 0.1"),
            ],
        ),
    ]
)


# ----------------------------------------------------------------- format


def test_all_expected_files_present():
    assert {p.stem for p in csvs("rsw")} == set(EXPECTED_ROWS)


@pytest.mark.parametrize("path", csvs("rsw"), ids=lambda p: p.name)
def test_format(path):
    check_format(
        path,
        metrics=METRICS,
        datasets=DATASETS,
        source_prefix="Realigned Softmax Warping for Deep Metric Learning (arXiv:2408.15656), Table ",
        strict_text=True,
        no_dash=True,
    )


@pytest.mark.parametrize("name,n", sorted(EXPECTED_ROWS.items()))
def test_row_counts(name, n):
    assert len(load(name)) == n


def test_percent_values_in_range():
    for name in EXPECTED_ROWS:
        df = load(name)
        pct = df[df.metric != "avg_dtp"]
        assert pct.value.astype(float).between(0, 100).all(), name


# ----------------------------------------------------------------- spot checks (from rsw.txt)


@pytest.mark.parametrize("name,value,std,where", SPOTS)
def test_spot(name, value, std, where):
    check(load(name), value, std, **where)


def test_table1_details():
    df = load("rsw_table1")
    assert cell(df, method="ProxyNCA", dataset="SOP", metric="recall@1").embedding_dim == "64"
    assert rows(df, method="ProxyNCA", metric="recall@10").empty  # printed '-'
    assert rows(df, method="RS@K", dataset=CUB).empty
    assert cell(df, method="HIST", dataset=CUB, metric="recall@1").citation == "43"
    # the Proxy-Anchor R512 row has no SOP numbers
    assert rows(df, method="Proxy-Anchor", backbone="ResNet-50", dataset="SOP").empty
    assert set(rows(df, method="CE").embedding_dim) == {"2048"}
    assert len(df[df.method.str.startswith("Warped-Softmax")]) == 3 * 12


def test_table2_all_std_printed():
    assert (load("rsw_table2")["std"] != "").all()


def test_table2_means_equal_table1_validation_row():
    t1 = rows(load("rsw_table1"), block=SR, method="Warped-Softmax")
    t2 = load("rsw_table2")
    a = dict(zip(zip(t1.dataset, t1.metric), t1.value))
    b = dict(zip(zip(t2.dataset, t2.metric), t2.value))
    assert a == b


def test_table3_details():
    df = load("rsw_table3")
    assert sorted(set(df.method)) == ["V0", "V1", "V2", "V3", "V4", "V5", "V6", "V7", "V8", "W1", "W2", "W3"]
    assert set(df[df.method.str.startswith("W")].block) == {"Eq. 7 Warp Comparisons f1(t1)-t2"}
    assert (df.dataset == CUB).all()


def test_table4_blocks():
    assert len(set(load("rsw_table4").block)) == 10


def test_table4_text_claim():
    """Sec. IV-F: Warped beats ProxyNCA++ and the Vanilla Softmax everywhere, HIST on all but
    Cutout and Jigsaw."""
    p = load("rsw_table4").pivot(index="block", columns="method", values="value").astype(float)
    w = p["Warped Softmax"]
    assert (w > p["ProxyNCA++"]).all() and (w > p["Regular Softmax"]).all()
    assert sorted(p.index[w <= p["HIST"]]) == ["Dropping Pixels: Cutout", "Geometric Distortions: Jigsaw"]


def test_table5_citations():
    df = load("rsw_table5")
    assert cell(df, method="SphereFace", dataset="LFW").citation == "73"
    assert cell(df, method="Arcface", dataset="LFW").citation == "5"


@pytest.mark.parametrize(
    "name,dataset,backbone",
    [("rsw_table6", CUB, "ResNet-50"), ("rsw_table7", CARS, None), ("rsw_table8", "SOP", "BN-Inception")],
)
def test_mlrc_tables_single_dataset(name, dataset, backbone):
    df = load(name)
    assert (df.dataset == dataset).all()
    if backbone is not None:
        assert (df.backbone == backbone).all()


def test_table6_aggregate_dim():
    assert set(rows(load("rsw_table6"), block=AG).embedding_dim) == {"128"}


def test_appendix_text_claim_24_of_27():
    """App. D: Warped-Softmax surpasses ProxyNCA++ in 24 of 27 categories."""
    wins = total = 0
    for name, ours in [
        ("rsw_table6", "Warped-Softmax"),
        ("rsw_table7", "Warped-Softmax"),
        ("rsw_table8", "Warped-Sotmax"),
    ]:
        df = load(name)
        a = rows(df, method=ours).set_index(["block", "metric"]).value.astype(float)
        b = rows(df, method="PrNCA++").set_index(["block", "metric"]).value.astype(float)
        wins += int((a > b.reindex(a.index)).sum())
        total += len(a)
    assert (wins, total) == (24, 27)
