"""config/miniature_headline.yaml over config/miniature.yaml (docs/miniature.md#staged-runs): the first stage
builds the cells of PFML Table 1's claims, their sensitivity set and gates, and nothing a later stage would
train again under another id."""

from __future__ import annotations

from pathlib import Path

from dmlrepro.plan import merged_configs
from dmlrepro.report.claims import load_catalogue
from dmlrepro.run_table import RunTable
from dmlrepro.runs import active_experiments

ROOT = Path(__file__).resolve().parents[2]
WHOLE = [str(ROOT / "config/miniature.yaml")]
STAGED = [*WHOLE, str(ROOT / "config/miniature_headline.yaml")]


def _cell_experiments(claim: dict) -> set[str]:
    """The experiments of a claim's faithful cells, gates and sensitivity set (not its opt-in tuned runs)."""
    spec = claim["scales"]["faithful"]
    cells = list(spec["cells"].values()) + [c["cell"] for c in spec.get("checks", []) if "cell" in c]
    cells += [c for alt in spec.get("sensitivity", []) if not alt.get("tuned") for c in alt["cells"].values()]
    return {cell["experiment"] for cell in cells}


def test_the_first_stage_builds_pfml_table_1s_claims_and_nothing_else():
    claims = [c for c in load_catalogue(ROOT / "config/claims.yaml") if c["id"] == "pfml-beats-proxy-anchor"]
    needed = set().union(*(_cell_experiments(c) for c in claims))
    assert set(active_experiments(merged_configs(STAGED))) == needed
    assert needed < set(active_experiments(merged_configs(WHOLE)))


def test_its_runs_are_the_whole_miniatures_runs():
    staged, whole = (RunTable(merged_configs(files)).all_trained() for files in (STAGED, WHOLE))
    assert staged and set(staged) < set(whole)
