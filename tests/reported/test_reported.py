"""Checks for the transcribed PFML paper tables in config/reported/.

Spot-check values below were read directly from the paper ("Potential Field Based Deep Metric
Learning": the PDF main paper and supplement, cross-read in the arXiv HTML rendering), not
copied from the CSVs.  Values are compared as
strings, because the CSVs keep numbers exactly as printed (e.g. "31.0", "78.11").
Shared helpers (reading, format rules, cell lookup): tests/reported/reported_csv.py.
"""

import pytest

from .reported_csv import cell, check, check_format, csvs, load, rows, spot_cases

# Supp Table 5 is the only table with text-valued cells.
TEXT_METRICS = {"optimizer", "bn_freeze"}

# Expected number of rows = number of numbers (non-"-" cells) in each printed table.
# Counted from the printed tables (PDF extraction), one row per printed value;
# "-" cells have no row.
EXPECTED_ROWS = {
    # Table 1, 9 columns (CUB R@1/2/4, Cars R@1/2/4, SOP R@1/10/100).
    #  ResNet50 block, 12 rows: 9 complete rows (ESPHN, N.Softmax, DCML-MDW, MS+DAS, HIST,
    #    HIER, HSE-PA, CPML, Ours) = 81; DiVA 6 (3 '-'); Proxy NCA++ 3 (R@1 only, see
    #    note); Proxy Anchor 6 (SOP '-') -> 96.
    #  BN Inception block, 14 rows: 10 complete (HTL, MultiSimilarity, SoftTriple,
    #    CircleLoss, ProxyGML, Proxy Anchor, DRML-PA, MS+DAS, HIST, Ours) = 90; DiVA 6;
    #    DFML-PA 2; HSE-M 6; PA+niV 6 -> 110.
    #  DINO block 4 x 9 = 36; ViT block 4 x 9 = 36.
    #  Total 96 + 110 + 36 + 36 = 278.
    "pfml_table1": 278,
    # Table 2: 6 methods x 4 columns (CUB R@1/R@2, Cars R@1/R@2), no '-' cells.
    "pfml_table2": 24,
    # Table 3: 5 methods x 1 column (average W2).
    "pfml_table3": 5,
    # Supp Table 1: 11 methods x 8 columns = 88, minus '-' at R@8 for SemiHard and
    # ProxyGML on both CUB and Cars (4) -> 84.
    "pfml_supp_table1": 84,
    # Supp Table 2: 10 methods x 4 columns = 40, minus '-': LiftedStruct 1, ProxyNCA 3,
    # SoftTriple 1, Clustering 1, ProxyGML 1 (7) -> 33.
    "pfml_supp_table2": 33,
    # Supp Tables 3 and 4 (MLRC): 17 methods x 6 columns (Concatenated-512 and
    # Separated-128 x P@1/RP/MAP@R), no '-' cells -> 102 each.
    "pfml_supp_table3": 102,
    "pfml_supp_table4": 102,
    # Supp Table 5: 7 hyperparameters x 6 dataset/architecture columns = 42.
    "pfml_supp_table5": 42,
    # Supp Table 6: 5 methods x 1 column (seconds per epoch).
    "pfml_supp_table6": 5,
}

R50, IBN = "ResNet50 (512 dim)", "BN Inception (512 dim)"
OURS = "Potential Field (Ours)"
CUB, CARS = "CUB-200-2011", "Cars-196"
C512, S128 = "Concatenated (512-dim)", "Separated (128-dim)"
BDMM = ("block", "dataset", "method", "metric")
DMM = ("dataset", "method", "metric")

# Spot values read from the paper: key column values, then the cell as printed ("value" or "value ± std").
SPOTS = spot_cases(
    [
        (
            "pfml_table1",
            BDMM,
            [
                (R50, CUB, OURS, "recall@1", "73.4 ± 0.3"),
                (R50, CARS, OURS, "recall@1", "92.7 ± 0.3"),
                (R50, CARS, "HIST", "recall@1", "89.6"),
                (R50, CUB, "CPML (Sec. 3.4)", "recall@1", "68.3"),
                (IBN, CUB, "MS+DAS", "recall@2", "78.11"),
                (IBN, "SOP", OURS, "recall@1", "80.6 ± 0.3"),
                ("DINO (384 dim)", CARS, "DINO", "recall@1", "42.9"),
                ("ViT (384 dim)", "SOP", OURS, "recall@100", "98.6 ± 0.1"),
            ],
        ),
        (
            "pfml_table2",
            DMM,
            [
                (CARS, "Ours", "recall@1", "84.5 ± 0.5"),
                (CUB, "Ours", "recall@1", "66.7 ± 0.6"),
                (CUB, "PA", "recall@1", "60.7"),
                (CARS, "Triplet", "recall@2", "77.9"),
            ],
        ),
        (
            "pfml_table3",
            ("method", "metric"),
            [
                ("CPML (Sec. 3.4)", "w2", "0.26 ± 0.03"),
                ("Ours", "w2", "0.16 ± 0.03"),
                ("S.Triplet", "w2", "0.24 ± 0.04"),
            ],
        ),
        (
            "pfml_supp_table1",
            DMM,
            [
                (CARS, "Ours", "recall@8", "97.1 ± 0.1"),
                (CUB, "HIST", "recall@1", "62.5"),
            ],
        ),
        (
            "pfml_supp_table2",
            ("method", "metric"),
            [
                ("Ours", "recall@1", "79.5 ± 0.2"),
                ("HIST", "recall@1000", "98.5"),
            ],
        ),
        # Supp Table 3 (MLRC, Cars-196)
        (
            "pfml_supp_table3",
            ("block", "method", "metric"),
            [
                (S128, "HIST", "precision@1", "79.3 ± 0.2"),
                (C512, "Ours", "map@r", "31.0 ± 0.3"),
                (S128, "Ours", "precision@1", "81.2 ± 0.2"),
            ],
        ),
        # Supp Table 4 (MLRC, CUB-200-2011)
        (
            "pfml_supp_table4",
            ("block", "method", "metric"),
            [
                (S128, "MultiSimilarity", "precision@1", "57.6 ± 0.2"),
                (S128, "Ours", "precision@1", "62.4 ± 0.1"),
                (C512, "Ours", "r_precision", "39.9 ± 0.1"),
            ],
        ),
        # Supp Table 5 (hyperparameters)
        (
            "pfml_supp_table5",
            ("dataset", "backbone", "metric"),
            [
                ("SOP", "ResNet-50", "bn_freeze", "No"),
                (CARS, "BN-Inception", "weight_decay", "1e-4"),
                (CUB, "ResNet-50", "weight_decay", "5e-4"),
                (CUB, "BN-Inception", "batch_size", "180"),
                ("SOP", "BN-Inception", "warm_up", "0"),
            ],
        ),
    ]
)


# ----------------------------------------------------------------- format


def test_all_expected_files_present():
    assert {p.stem for p in csvs("pfml")} == set(EXPECTED_ROWS)


@pytest.mark.parametrize("path", csvs("pfml"), ids=lambda p: p.name)
def test_format(path):
    check_format(path, text_metrics=TEXT_METRICS)


@pytest.mark.parametrize("name,n", sorted(EXPECTED_ROWS.items()))
def test_row_counts(name, n):
    assert len(load(name)) == n


# ----------------------------------------------------------------- spot checks


@pytest.mark.parametrize("name,value,std,where", SPOTS)
def test_spot(name, value, std, where):
    check(load(name), value, std, **where)


def test_table1_details():
    df = load("pfml_table1")
    assert cell(df, block=R50, method="HIST", metric="recall@1", dataset="SOP").citation == "28"
    # '-' cells have no row: Proxy Anchor (R50) has no SOP numbers
    assert rows(df, block=R50, method="Proxy Anchor", dataset="SOP").empty
    # DFML-PA (BN Inception) prints only CUB R@1 and Cars R@1
    assert sorted(rows(df, method="DFML-PA").value) == ["69.3", "88.4"]


def test_supp_table1_details():
    df = load("pfml_supp_table1")
    assert (df.embedding_dim == "64").all()
    assert rows(df, method="SemiHard", metric="recall@8").empty


def test_supp_table2_details():
    assert list(rows(load("pfml_supp_table2"), method="ProxyNCA").value) == ["73.7"]


@pytest.mark.parametrize("name,dataset", [("pfml_supp_table3", CARS), ("pfml_supp_table4", CUB)])
def test_mlrc_tables_single_dataset(name, dataset):
    assert (load(name).dataset == dataset).all()


def test_supp_table5_hyperparameters_constant():
    df = load("pfml_supp_table5")
    assert set(rows(df, metric="lr_for_proxies").value) == {"0.01"}
    assert set(rows(df, metric="learning_rate").value) == {"1e-4"}
    assert set(rows(df, metric="optimizer").value) == {"Adam"}


def test_supp_table6_timing_spot():
    df = load("pfml_supp_table6")
    got = list(zip(df.method, df.value, df["std"]))
    assert got == [
        ("ProxyNCA", "14.2", "0.1"),
        ("Proxy Anchor", "14.2", "0.1"),
        ("Potential Field (Ours) M=5", "14.3", "0.1"),
        ("Potential Field (Ours) M=20", "14.5", "0.1"),
        ("Potential Field (Ours) M=30", "14.8", "0.1"),
    ]
    assert (df.metric == "seconds_per_epoch").all()
