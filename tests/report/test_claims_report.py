"""The Claims section end to end without Snakemake: fabricated runs' metrics.json content -> the
per-seed tables rule aggregate writes -> claims_section with the repository's catalogue ->
index.html, where the section comes first with each claim's quote, numbers and verdict."""

import re
from pathlib import Path

import pytest
from scipy import stats

from dmlrepro.report import provenance, render_report, write_table
from dmlrepro.report.aggregate import seed_table
from dmlrepro.report.claims import claims_section, load_catalogue, seed_tables
from dmlrepro.report.html import pvalue

ROOT = Path(__file__).resolve().parents[2]

# fabricated R@1 per seed on the miniature's pfml_table1: PFML clearly above Proxy Anchor (built to
# hold), clearly below CPML (built to fail), beside Multi-Similarity with one seed (inconclusive)
RECALL = {"pfml": [0.42, 0.45, 0.41], "proxy_anchor": [0.33, 0.30, 0.36], "cpml": [0.55, 0.57, 0.56],
          "multi_similarity": [0.10]}
SECTION = {"experiment": "pfml_table1", "title": "PFML Table 1 — Recall@K (miniature)", "description": "", "kind": "table",
           "reported": None, "block": None, "paper_says": "", "figures": [], "table": None, "ratios": [],
           "hparams": [], "notes": [], "runs": []}


def fabricated_records():
    return [{"method": method, "dataset": "synthetic", "sweep": {}, "seed": seed,
             "result": {"status": "completed", "metrics": {"recall@1": value, "recall@2": value + 0.1}}}
            for method, values in RECALL.items() for seed, value in enumerate(values)]


@pytest.fixture
def report(tmp_path):
    seeds = tmp_path / "experiments" / "seeds" / "pfml_table1.csv"
    seeds.parent.mkdir(parents=True)
    write_table(seed_table(fabricated_records(), ["recall@1", "recall@2"]), seeds)
    claims = claims_section(load_catalogue(ROOT / "config" / "claims.yaml"), "miniature",
                            seed_tables(["pfml_table1"], [seeds]), ROOT / "config" / "reported")
    html = tmp_path / "report" / "index.html"
    render_report([SECTION], [tmp_path], provenance(ROOT, [], {}), html, ROOT / "reports" / "templates", claims=claims)
    return claims, html.read_text()


def _block(html, claim_id):
    start = html.index(f'<div id="claim-{claim_id}">')
    return html[start:html.index("</div>", start)]


def test_claims_section_comes_first(report):
    _, html = report
    assert html.index('<section id="claims">') < html.index('<section id="pfml_table1">')
    assert '<a href="#claims">Claims</a>' in html


def test_fabricated_claims_get_their_verdicts(report):
    claims, html = report
    verdicts = {c["id"]: c["verdict"] for c in claims["claims"]}
    assert verdicts["pfml-beats-proxy-anchor"] == "holds"
    assert verdicts["pfml-beats-cpml"] == "contradicted"
    assert verdicts["pfml-beats-multi-similarity"] == "inconclusive"
    assert verdicts["pfml-beats-all-table1"] == "contradicted"  # CPML beats PFML
    held = _block(html, "pfml-beats-proxy-anchor")
    assert "<b>holds</b>" in held
    # the numbers it rests on, in %: means ± std (n), Δ and the Welch p-value
    ref = stats.ttest_ind([42, 45, 41], [33, 30, 36], equal_var=False)  # p = 0.0133
    assert "42.67 ± 2.08" in held and "33.00 ± 3.00" in held and "(n = 3)" in held
    assert "+9.67" in held and f"<td>{pvalue(ref.pvalue)}</td>" in held and pvalue(ref.pvalue) == "0.0133"
    assert f"<td>{ref.df:.1f}</td>" in held and f"<td>{ref.statistic:+.2f}</td>" in held
    assert "two-sided Welch t-test" in held
    assert "<b>contradicted</b>" in _block(html, "pfml-beats-cpml")
    assert "n &lt; 2 on a side" in _block(html, "pfml-beats-multi-similarity")


def test_quotes_citations_and_the_papers_numbers(report):
    _, html = report
    held = _block(html, "pfml-beats-proxy-anchor")
    assert "significantly outperforming the best-performing proxy-based methods" in held
    assert "PFML, Sec. 4.2, Table 1" in held
    assert "PFML: 73.4 ± 0.3" in held and "Proxy Anchor: 69.7" in held  # PFML Table 1, CUB-200-2011
    # a claim whose cells have no runs here: no numbers of ours, the paper's for context
    rsw = _block(html, "rsw-warp-beats-eq4")
    assert "Warped-Softmax: 72.6" in rsw and "Softmax (Eq. 4): 69.1" in rsw


def test_counts_add_up(report):
    claims, html = report
    counts = claims["counts"]
    assert sum(counts.values()) == len(claims["claims"]) == len(load_catalogue(ROOT / "config" / "claims.yaml"))
    assert counts["holds"] == 1 and counts["contradicted"] == 2
    found = re.search(r"(\d+) hold</span>, <span class=\"off\">(\d+) contradicted", html)
    assert found and found.groups() == ("1", "2")


def test_no_claims_no_section(tmp_path):
    html = tmp_path / "index.html"
    render_report([SECTION], [tmp_path], provenance(ROOT, [], {}), html, ROOT / "reports" / "templates")
    assert 'id="claims"' not in html.read_text()
