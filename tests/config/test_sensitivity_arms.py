"""Each pre-registered sensitivity arm of the faithful miniature (config/claims.yaml `sensitivity`,
config/miniature.yaml) trains the claim's cells under its reading's alternative and nothing else: per side,
dataset and seed, its run config differs from the chosen cell's exactly in the keys that reading names
(docs/readings: each entry's **Key.**), so a flip of the verdict is the reading's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from dmlrepro.plan import merged_configs
from dmlrepro.report.claims import load_catalogue, reading_ids
from dmlrepro.run_table import RunTable

ROOT = Path(__file__).resolve().parents[2]

#: the run-config keys each consequential reading sets (docs/readings: PFML-R4, PFML-R15, RSW-R25, ASAP-R40)
READING_KEYS = {
    "pfml-r4": {"grad_clip.value"},
    "pfml-r15": {"schedule.name", "schedule.step", "schedule.gamma"},
    "rsw-r25": {"loss.hparams.alpha", "loss.hparams.scale", "followup.loss.alpha", "followup.loss.scale"},
    "asap-r40": {"optimizer.lr"},
}


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _arms() -> list[tuple[str, dict, dict, list[str]]]:
    """(claim id, chosen cells, alternative, datasets) of every untuned faithful alternative."""
    arms = []
    for claim in load_catalogue(ROOT / "config/claims.yaml"):
        spec = (claim.get("scales") or {}).get("faithful") or {}
        for alternative in spec.get("sensitivity") or []:
            if not alternative.get("tuned"):
                arms.append((claim["id"], spec["cells"], alternative, spec["datasets"]))
    return arms


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str, str, int, frozenset], dict]:
    """(experiment, method, dataset, seed, sweep point) -> resolved run config, every opt-in experiment included."""
    config = merged_configs([str(ROOT / "config/miniature.yaml")])
    config["opt_in"] = [name for name, e in config["experiments"].items() if e.get("opt_in") and "search" not in e]
    table = RunTable(config)
    return {
        (experiment, run.method, run.dataset, run.seed, _point(point)): run.config
        for run in table.runs.values()
        for experiment, point in run.experiments.items()
    }


def _point(sweep: Mapping | None) -> frozenset:
    return frozenset((sweep or {}).items())


def _differing(a: Mapping, b: Mapping) -> set[str]:
    fa, fb = _flat(a), _flat(b)
    return {key for key in fa.keys() | fb.keys() if fa.get(key) != fb.get(key)}


def test_every_faithful_claim_declares_its_consequential_readings():
    declared = {(claim, r) for claim, _, alt, _ in _arms() for r in reading_ids(alt)}
    pfml = [
        c["id"]
        for c in load_catalogue(ROOT / "config/claims.yaml")
        if c["paper"] == "PFML" and "faithful" in c["scales"]
    ]
    assert len(pfml) == 9
    for claim in pfml:
        assert {(claim, "pfml-r4"), (claim, "pfml-r15")} <= declared, claim
    for claim in ("rsw-warp-beats-eq4",):
        assert (claim, "rsw-r25") in declared
    for claim in ("asap-beats-base-loss", "asap-beats-xbm"):
        assert (claim, "asap-r40") in declared


@pytest.mark.parametrize("arm", _arms(), ids=lambda arm: f"{arm[0]}:{'+'.join(reading_ids(arm[2]))}")
def test_an_arm_departs_from_the_chosen_cells_in_its_readings_keys_only(arm, runs):
    _, chosen, alternative, datasets = arm
    expected = set().union(*(READING_KEYS[r] for r in reading_ids(alternative)))
    compared = 0
    for side, cell in alternative["cells"].items():
        base = chosen[side]
        swept = _point(cell.get("sweep"))  # the cell's sweep point (an experiment's one-point sweep may go unnamed)
        for (experiment, method, dataset, seed, point), config in runs.items():
            if (experiment, method) != (cell["experiment"], cell["method"]) or not swept <= point:
                continue
            if dataset not in datasets:
                continue
            other = runs[(base["experiment"], base["method"], dataset, seed, point - swept | _point(base.get("sweep")))]
            differing = _differing(config, other)
            assert differing and differing <= expected, (side, dataset, seed, sorted(differing))
            compared += 1
    assert compared >= 3 * len(alternative["cells"])  # every side, every seed
