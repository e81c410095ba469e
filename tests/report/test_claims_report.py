"""The Claims section end to end without Snakemake: fabricated runs' metrics.json content -> the
per-seed tables rule aggregate writes -> claims_section with the repository's catalogue ->
index.html, where the section comes first with each claim's quote, numbers, mechanism checks and
verdict, and claims.json, which says the same."""

import json
import re
from html import escape
from pathlib import Path

import jinja2
import pytest
from scipy import stats

from dmlrepro.report import provenance, render_report, write_table
from dmlrepro.report.aggregate import seed_table
from dmlrepro.report.claims import (
    NOT_TESTABLE,
    claims_section,
    load_catalogue,
    load_check_ranges,
    scale_spec,
    seed_tables,
    write_claims,
)
from dmlrepro.report.html import pvalue

ROOT = Path(__file__).resolve().parents[2]

# fabricated R@1 per seed on the miniature's pfml_table1: PFML clearly above Proxy Anchor (built to
# hold), clearly below CPML (built to fail), beside Multi-Similarity with one seed (inconclusive)
RECALL = {
    "pfml": [0.42, 0.45, 0.41],
    "proxy_anchor": [0.33, 0.30, 0.36],
    "cpml": [0.55, 0.57, 0.56],
    "multi_similarity": [0.10],
}
SECTION = {
    "experiment": "pfml_table1",
    "title": "PFML Table 1 — Recall@K (miniature)",
    "description": "",
    "kind": "table",
    "reported": None,
    "block": None,
    "paper_says": "",
    "figures": [],
    "table": None,
    "ratios": [],
    "hparams": [],
    "notes": [],
    "runs": [],
}


# the mechanism the PFML claims' checks ask for (config/claims.yaml): the untrained network at R@1 0.20
# (Proxy Anchor's gain about 13 points), PFML's W₂ 0.17 (Table 3's order: 0.16), losses on a plateau
UNTRAINED, W2, PLATEAU = [0.20, 0.21, 0.19], 0.17, 0.01


def fabricated_records(untrained=UNTRAINED, plateau=PLATEAU):
    return [
        {
            "method": method,
            "dataset": "double_digits",
            "sweep": {},
            "seed": seed,
            "result": {
                "status": "completed",
                "metrics": {"recall@1": value, "recall@2": value + 0.1},
                "untrained_metrics": {"recall@1": untrained[seed], "recall@2": untrained[seed] + 0.1},
            },
            "mechanism": {"loss_last_change": plateau},
        }
        for method, values in RECALL.items()
        for seed, value in enumerate(values)
    ]


def w2_records(w2=W2):
    """pfml_table3_w2's PFML run: the W₂ the pfml_w2 check reads."""
    return [
        {
            "method": "pfml",
            "dataset": "double_digits",
            "sweep": {},
            "seed": 0,
            "result": {
                "status": "completed",
                "metrics": {"recall@1": 0.4},
                "proxy_metrics": {"w2": w2, "proxy_delta": 0.2},
            },
            "mechanism": {"loss_last_change": PLATEAU},
        }
    ]


def build_report(folder, records, w2=W2):
    paths = []
    for name, rows, metrics in [
        ("pfml_table1", records, ["recall@1", "recall@2"]),
        ("pfml_table3_w2", w2_records(w2), ["w2", "recall@1"]),
    ]:
        path = folder / "experiments" / "seeds" / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_table(seed_table(rows, metrics), path)
        paths.append(path)
    claims = claims_section(
        load_catalogue(ROOT / "config" / "claims.yaml"),
        "miniature",
        seed_tables(["pfml_table1", "pfml_table3_w2"], paths),
        ROOT / "config" / "reported",
        load_check_ranges(ROOT / "config" / "claims.yaml"),
    )
    html = folder / "report" / "index.html"
    render_report([SECTION], [folder], provenance(ROOT, [], {}), html, ROOT / "reports" / "templates", claims=claims)
    write_claims(claims, folder / "report" / "claims.json")
    return claims, html.read_text()


@pytest.fixture
def report(tmp_path):
    return build_report(tmp_path, fabricated_records())


def _block(html, claim_id):
    start = html.index(f'<div id="claim-{claim_id}">')
    return html[start : html.index("</div>", start)]


def test_claims_section_comes_first(report):
    _, html = report
    assert html.index('<section id="claims">') < html.index('<section id="pfml_table1">')
    assert '<a href="#claims">Claims</a>' in html


def test_fabricated_claims_get_their_verdicts(report):
    claims, html = report
    verdicts = {c["id"]: c["verdict"] for c in claims["claims"]}
    assert verdicts["pfml-beats-proxy-anchor"] == "holds"
    # the tests contradict it, but three seeds, no tuning, no validation and no sensitivity set do not earn that
    assert verdicts["pfml-beats-cpml"] == "not reproduced"
    assert {c["id"]: c["test_verdict"] for c in claims["claims"]}["pfml-beats-cpml"] == "contradicted"
    # Multi-Similarity's one seed cannot show that it beats its untrained network (no paired test)
    assert verdicts["pfml-beats-multi-similarity"] == NOT_TESTABLE
    # CPML beats PFML, but ProxyNCA and Triplet have no runs here: their plateau is not shown
    assert verdicts["pfml-beats-all-table1"] == NOT_TESTABLE
    assert {c["id"]: c["test_verdict"] for c in claims["claims"]}["pfml-beats-all-table1"] == "contradicted"
    held = _block(html, "pfml-beats-proxy-anchor")
    assert "<b>holds</b>" in held
    # the numbers it rests on, in %: means ± std (n), Δ and the Welch p-value
    ref = stats.ttest_ind([42, 45, 41], [33, 30, 36], equal_var=False)  # p = 0.0133
    assert "42.67 ± 2.08" in held and "33.00 ± 3.00" in held and "(n = 3)" in held
    assert "+9.67" in held and f"<td>{pvalue(ref.pvalue)}</td>" in held and pvalue(ref.pvalue) == "0.0133"
    assert f"<td>{ref.df:.1f}</td>" in held and f"<td>{ref.statistic:+.2f}</td>" in held
    assert "two-sided Welch t-test" in held
    assert "<b>not reproduced</b>" in _block(html, "pfml-beats-cpml")
    assert "a contradiction also needs: <b>equal tuning" in _block(html, "pfml-beats-cpml")
    assert "n &lt; 2 on a side" in _block(html, "pfml-beats-multi-similarity")
    assert {c["id"]: c["test_verdict"] for c in claims["claims"]}["pfml-beats-multi-similarity"] == "inconclusive"


def test_quotes_citations_and_the_papers_numbers(report):
    _, html = report
    held = _block(html, "pfml-beats-proxy-anchor")
    assert "significantly outperforming the best-performing proxy-based methods" in held
    assert "PFML, Sec. 4.2, Table 1" in held
    assert "PFML: 73.4 ± 0.3" in held and "Proxy Anchor: 69.7" in held  # PFML Table 1, CUB-200-2011
    # a claim whose cells have no runs here: no numbers of ours, the paper's for context
    rsw = _block(html, "rsw-warp-beats-eq4")
    assert "Warped-Softmax: 72.6" in rsw and "Softmax (Eq. 4): 69.1" in rsw


def test_the_intro_names_the_catalogues_papers(report):
    """A user's catalogue (paper: Mine, docs/tasks/own-loss.md) is not "the three papers": the intro names them."""
    _, html = report
    assert "claim of the catalogue (papers: PFML, RSW, ASAP)" in html


BUILT = {"pfml_table1", "pfml_table3_w2"}  # the experiments build_report writes


def _cells(claim):
    return scale_spec(claim, "miniature")["cells"].values()


def test_counts_add_up(report):
    claims, html = report
    counts = claims["counts"]
    assert sum(counts.values()) == len(claims["claims"]) == len(load_catalogue(ROOT / "config" / "claims.yaml"))
    assert counts["holds"] == 1 and counts["not reproduced"] == 1 and counts["contradicted"] == 0
    # every other claim on the two built experiments has one side with a single seed or no runs: its checks
    # fail; a claim on experiments not built is not run
    catalogue = load_catalogue(ROOT / "config" / "claims.yaml")
    built = [c for c in catalogue if BUILT & {cell["experiment"] for cell in _cells(c)}]
    assert counts[NOT_TESTABLE] == len(built) - 2 and counts["not run"] == len(catalogue) - len(built) > 0
    found = re.search(
        r"(\d+) hold</span>, <span class=\"open\">(\d+) not reproduced</span>,\s*<span class=\"open\">(\d+) "
        r"recipe-sensitive</span>, <span class=\"off\">(\d+) contradicted</span>,\s*<span class=\"open\">(\d+) "
        r"not testable at this scale",
        html,
    )
    assert found and found.groups() == ("1", "1", "0", "0", str(counts[NOT_TESTABLE]))


def test_no_claims_no_section(tmp_path):
    html = tmp_path / "index.html"
    render_report([SECTION], [tmp_path], provenance(ROOT, [], {}), html, ROOT / "reports" / "templates")
    assert 'id="claims"' not in html.read_text()


# ---- the mechanism checks gate the verdicts -----------------------------------------------------------


@pytest.mark.parametrize(
    "change, failing",
    [
        ({"w2": 5.8}, "pfml_w2 (pfml_table3_w2: pfml, double_digits)"),  # the proxies left the data (W₂ 5.8 vs 0.16)
        (
            {"untrained": [0.40, 0.41, 0.39]},
            "beats_untrained (Proxy Anchor, double_digits)",
        ),  # no room to learn: every compared side is checked
        ({"plateau": 0.30}, "loss_plateau (PFML, double_digits)"),  # the loss still falling
    ],
)
def test_a_failing_check_makes_a_significant_claim_not_testable(tmp_path, change, failing):
    records = fabricated_records(untrained=change.get("untrained", UNTRAINED), plateau=change.get("plateau", PLATEAU))
    claims, html = build_report(tmp_path, records, w2=change.get("w2", W2))
    found = {c["id"]: c for c in claims["claims"]}["pfml-beats-proxy-anchor"]
    assert found["test_verdict"] == "holds" and found["p"] < 0.05  # Δ = +9.67, p = 0.0133: significant
    assert found["verdict"] == NOT_TESTABLE
    assert failing in found["failing_checks"]
    block = _block(html, "pfml-beats-proxy-anchor")
    assert "<b>not testable at this scale</b>" in block and failing in block
    row = html[html.index('<a href="#claim-pfml-beats-proxy-anchor">') :]
    assert row[: row.index("</tr>")].count(failing) == 1  # named in the summary table too


def test_passing_checks_let_the_verdict_through(report):
    claims, html = report
    found = {c["id"]: c for c in claims["claims"]}["pfml-beats-proxy-anchor"]
    assert found["verdict"] == found["test_verdict"] == "holds" and found["failing_checks"] == []
    checks = {(k["name"], k["target"]): k for k in found["checks"]}
    gain = checks[("beats_untrained", "Proxy Anchor")]
    # Proxy Anchor 33.0 after training, 20.0 before: +13.0 points; paired t over the three seeds
    assert gain["value"] == pytest.approx(13.0) and gain["pass"]
    assert gain["p"] == pytest.approx(stats.ttest_rel([33, 30, 36], [20, 21, 19]).pvalue)
    assert checks[("pfml_w2", "pfml_table3_w2: pfml")]["value"] == pytest.approx(W2 / 0.2)  # W₂ over δ
    assert "untrained: 20.00 ± 1.00" in _block(html, "pfml-beats-proxy-anchor")


def _summary_verdicts(html):
    """claim id -> the verdict the summary table shows (and the failing checks it names)."""
    out = {}
    for claim_id, cell in re.findall(
        r'<a href="#claim-([a-z0-9-]+)">[^<]*</a></td><td class="label">[^<]*</td>'
        r'<td class="label wrap">(.*?)</td>',
        html,
    ):
        bold = re.search(r"<b>(.*?)</b>", cell)
        named = re.search(r"\(failing: (.*?)\)</span>", cell)
        out[claim_id] = (bold.group(1) if bold else "not run at this scale", named.group(1) if named else "")
    return out


@pytest.mark.parametrize("w2", [W2, 5.8])
def test_claims_json_matches_the_rendered_section(tmp_path, w2):
    build_report(tmp_path, fabricated_records(), w2=w2)
    html = (tmp_path / "report" / "index.html").read_text()
    record = json.loads((tmp_path / "report" / "claims.json").read_text())
    shown = _summary_verdicts(html)
    assert list(shown) == [c["id"] for c in record["claims"]]
    for claim in record["claims"]:
        assert shown[claim["id"]] == (claim["verdict"], "; ".join(claim["failing_checks"])), claim["id"]
        block = _block(html, claim["id"])
        assert block.count('<span class="ok">pass</span>') == sum(k["pass"] for k in claim["checks"])
        assert block.count('<span class="off">fail</span>') == sum(not k["pass"] for k in claim["checks"])
        for check in claim["checks"]:
            assert set(check) >= {"name", "value", "expected", "pass"} and escape(check["expected"]) in block
    assert record["counts"] == {
        **{
            v: sum(c["verdict"] == v for c in record["claims"])
            for v in ("holds", "not reproduced", "recipe-sensitive", "contradicted", NOT_TESTABLE)
        },
        "not run": sum(c["verdict"] == "not run at this scale" for c in record["claims"]),
    }


def test_a_not_testable_claim_names_the_readings_that_flip_its_tests():
    """The overview's verdict cell: a failing gate decides the verdict, and a flip under a reading's
    alternative is still shown beside it (docs/report.md#verdicts), not hidden behind "not testable"."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "reports" / "templates")), autoescape=True)
    macros = env.get_template("claims_macros.html.j2").module
    claim = {"verdict": NOT_TESTABLE, "failing_checks": ["proxy_spread (PFML, double_mnist)"], "sensitive_to": []}
    assert "also changes" not in str(macros.untested(claim))
    flipped = str(macros.untested({**claim, "sensitive_to": ["PFML-R15", "PFML-R4 + PFML-R15"]}))
    assert "failing: proxy_spread (PFML, double_mnist)" in flipped
    assert "the tests' verdict also changes under PFML-R15, PFML-R4 + PFML-R15" in flipped
