"""A run directory written while model.standin existed (its config.yaml holds `standin: null`, as every run
the shipped configs made then) still evaluates and is still the same run (dmlrepro.train.config_keys.RETIRED_KEYS)."""

from __future__ import annotations

import yaml

from dmlrepro.train import evaluate_run, train_run


def _as_written_before(out):
    """config.yaml as the engine wrote it while the generated stand-in existed: `standin: null` beside `pretrained`."""
    path = out / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    model = {}
    for key, value in cfg["model"].items():
        model[key] = value
        if key == "pretrained":
            model["standin"] = None
    path.write_text(yaml.safe_dump({**cfg, "model": model}, sort_keys=False))


def test_a_run_written_with_the_retired_key_evaluates_and_is_the_same_run(tiny, tmp_path):
    out = tmp_path / "run"
    first = train_run(tiny(epochs=1), out, progress=False)
    _as_written_before(out)
    assert evaluate_run(out)["metrics"] == first["metrics"]
    _as_written_before(out)
    assert train_run(tiny(epochs=1), out, progress=False)["metrics"] == first["metrics"]  # finished, not refused
