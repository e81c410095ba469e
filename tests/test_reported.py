"""Checks for the transcribed PFML paper tables in config/reported/.

Spot-check values below were read directly from the paper extractions
(/work/shared/papers/pfml.pdf-extract.txt, pfml-supplement.txt, cross-read in
pfml.html-extract.txt), not copied from the CSVs.  Values are compared as
strings, because the CSVs keep numbers exactly as printed (e.g. "31.0", "78.11").
"""
from pathlib import Path

import pandas as pd
import pytest

REPORTED = Path(__file__).resolve().parents[1] / "config" / "reported"

COLUMNS = ["table", "block", "method", "citation", "backbone", "embedding_dim",
           "dataset", "metric", "value", "std", "source", "note"]
REQUIRED = ["table", "method", "metric", "value", "source"]

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


def load(name):
    return pd.read_csv(REPORTED / f"{name}.csv", dtype=str, keep_default_na=False)


def all_csvs():
    return sorted(REPORTED.glob("*.csv"))


def is_number(s):
    try:
        float(s)
        return True
    except ValueError:
        return False


def cell(df, **where):
    """The single row matching all column==value conditions."""
    mask = pd.Series(True, index=df.index)
    for k, v in where.items():
        mask &= df[k] == v
    hit = df[mask]
    assert len(hit) == 1, f"{where}: {len(hit)} rows"
    return hit.iloc[0]


def check(df, value, std="", **where):
    r = cell(df, **where)
    assert (r.value, r["std"]) == (value, std), (where, r.value, r["std"])


# ----------------------------------------------------------------- format

def test_all_expected_files_present():
    assert {p.stem for p in all_csvs()} == set(EXPECTED_ROWS)


@pytest.mark.parametrize("path", all_csvs(), ids=lambda p: p.name)
def test_format(path):
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert list(df.columns) == COLUMNS
    assert len(df) > 0
    for col in REQUIRED:
        assert (df[col].str.strip() != "").all(), f"empty {col} in {path.name}"
    assert (df["table"] == path.stem).all()
    numeric = ~df["metric"].isin(TEXT_METRICS)
    bad = df[numeric & ~df["value"].map(is_number)]
    assert bad.empty, bad[["method", "metric", "value"]]
    std = df["std"][df["std"] != ""]
    assert std.map(is_number).all()
    cit = df["citation"][df["citation"] != ""]
    assert cit.str.fullmatch(r"\d+").all()
    dim = df["embedding_dim"][df["embedding_dim"] != ""]
    assert dim.str.fullmatch(r"\d+").all()
    # one row per printed cell: no duplicated keys
    key = ["block", "method", "backbone", "embedding_dim", "dataset", "metric"]
    assert not df.duplicated(key).any()


@pytest.mark.parametrize("name,n", sorted(EXPECTED_ROWS.items()))
def test_row_counts(name, n):
    assert len(load(name)) == n


# ----------------------------------------------------------------- spot checks

def test_table1_spot():
    df = load("pfml_table1")
    r50, ibn = "ResNet50 (512 dim)", "BN Inception (512 dim)"
    ours = "Potential Field (Ours)"
    check(df, "73.4", "0.3", block=r50, method=ours, dataset="CUB-200-2011", metric="recall@1")
    check(df, "92.7", "0.3", block=r50, method=ours, dataset="Cars-196", metric="recall@1")
    check(df, "89.6", block=r50, method="HIST", dataset="Cars-196", metric="recall@1")
    assert cell(df, block=r50, method="HIST", metric="recall@1", dataset="SOP").citation == "28"
    check(df, "68.3", block=r50, method="CPML (Sec. 3.4)", dataset="CUB-200-2011", metric="recall@1")
    check(df, "78.11", block=ibn, method="MS+DAS", dataset="CUB-200-2011", metric="recall@2")
    check(df, "80.6", "0.3", block=ibn, method=ours, dataset="SOP", metric="recall@1")
    check(df, "42.9", block="DINO (384 dim)", method="DINO", dataset="Cars-196", metric="recall@1")
    check(df, "98.6", "0.1", block="ViT (384 dim)", method=ours, dataset="SOP", metric="recall@100")
    # '-' cells have no row: Proxy Anchor (R50) has no SOP numbers
    assert df[(df.block == r50) & (df.method == "Proxy Anchor") & (df.dataset == "SOP")].empty
    # DFML-PA (BN Inception) prints only CUB R@1 and Cars R@1
    assert sorted(df[df.method == "DFML-PA"].value) == ["69.3", "88.4"]


def test_table2_spot():
    df = load("pfml_table2")
    check(df, "84.5", "0.5", method="Ours", dataset="Cars-196", metric="recall@1")
    check(df, "66.7", "0.6", method="Ours", dataset="CUB-200-2011", metric="recall@1")
    check(df, "60.7", method="PA", dataset="CUB-200-2011", metric="recall@1")
    check(df, "77.9", method="Triplet", dataset="Cars-196", metric="recall@2")


def test_table3_spot():
    df = load("pfml_table3")
    check(df, "0.26", "0.03", method="CPML (Sec. 3.4)", metric="w2")
    check(df, "0.16", "0.03", method="Ours", metric="w2")
    check(df, "0.24", "0.04", method="S.Triplet", metric="w2")


def test_supp_table1_spot():
    df = load("pfml_supp_table1")
    check(df, "97.1", "0.1", method="Ours", dataset="Cars-196", metric="recall@8")
    check(df, "62.5", method="HIST", dataset="CUB-200-2011", metric="recall@1")
    assert (df.embedding_dim == "64").all()
    assert df[(df.method == "SemiHard") & (df.metric == "recall@8")].empty


def test_supp_table2_spot():
    df = load("pfml_supp_table2")
    check(df, "79.5", "0.2", method="Ours", metric="recall@1")
    check(df, "98.5", method="HIST", metric="recall@1000")
    assert list(df[df.method == "ProxyNCA"].value) == ["73.7"]


def test_supp_table3_mlrc_cars_spot():
    df = load("pfml_supp_table3")
    check(df, "79.3", "0.2", method="HIST", block="Separated (128-dim)", metric="precision@1")
    check(df, "31.0", "0.3", method="Ours", block="Concatenated (512-dim)", metric="map@r")
    check(df, "81.2", "0.2", method="Ours", block="Separated (128-dim)", metric="precision@1")
    assert (df.dataset == "Cars-196").all()


def test_supp_table4_mlrc_cub_spot():
    df = load("pfml_supp_table4")
    check(df, "57.6", "0.2", method="MultiSimilarity", block="Separated (128-dim)", metric="precision@1")
    check(df, "62.4", "0.1", method="Ours", block="Separated (128-dim)", metric="precision@1")
    check(df, "39.9", "0.1", method="Ours", block="Concatenated (512-dim)", metric="r_precision")
    assert (df.dataset == "CUB-200-2011").all()


def test_supp_table5_hyperparameters_spot():
    df = load("pfml_supp_table5")
    check(df, "No", dataset="SOP", backbone="ResNet-50", metric="bn_freeze")
    check(df, "1e-4", dataset="Cars-196", backbone="BN-Inception", metric="weight_decay")
    check(df, "5e-4", dataset="CUB-200-2011", backbone="ResNet-50", metric="weight_decay")
    check(df, "180", dataset="CUB-200-2011", backbone="BN-Inception", metric="batch_size")
    check(df, "0", dataset="SOP", backbone="BN-Inception", metric="warm_up")
    assert set(df[df.metric == "lr_for_proxies"].value) == {"0.01"}
    assert set(df[df.metric == "learning_rate"].value) == {"1e-4"}
    assert set(df[df.metric == "optimizer"].value) == {"Adam"}


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
