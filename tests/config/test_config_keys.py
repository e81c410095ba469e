"""The run-config key table (dmlrepro.train.config_keys): the defaults, the late, runtime and retired keys
and docs/training.md's key tables all come from it."""

from pathlib import Path

import pytest
import yaml

from dmlrepro.train.config import (
    DEFAULTS,
    LATE_DEFAULTS,
    RUNTIME_KEYS,
    ConfigError,
    config_identity,
    dump_yaml,
    resolve_run_config,
    section_value,
    without_late_defaults,
    without_retired_keys,
)
from dmlrepro.train.config_keys import KEYS, markdown_tables, update_docs

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and value and f"{prefix}{key}" not in {k.name for k in KEYS}:
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def test_docs_key_tables_are_the_generated_ones():
    text = DOC.read_text(encoding="utf-8")
    assert update_docs(text) == text, "run `python -m dmlrepro.train.config_keys --write docs/training.md`"
    for table in markdown_tables().values():
        assert table in text


def test_every_key_has_one_row_in_the_docs_tables():
    tables = "\n".join(markdown_tables().values())
    for key in KEYS:
        assert tables.count(f"\n| `{key.name}`") == 1, key.name


def test_defaults_are_the_tables_defaults_and_pass_their_own_checks():
    assert _leaves(DEFAULTS) == [key.name for key in KEYS]
    for key in KEYS:
        assert key.check(key.name, key.default) == key.default, key.name


def test_late_keys_at_their_default_leave_the_identity():
    identity = config_identity(resolve_run_config({}))
    for section, key in LATE_DEFAULTS:
        assert key not in (identity if section is None else identity.get(section, {})), (section, key)
    for section, key in RUNTIME_KEYS:
        assert key not in (identity if section is None else identity.get(section, {})), (section, key)
    changed = resolve_run_config({"eval": {"normalize": "l2"}, "validation": {"fraction": 0.2}})
    assert without_late_defaults(changed)["eval"]["normalize"] == "l2"
    assert without_late_defaults(changed)["validation"]["fraction"] == 0.2


def test_section_value_reads_a_late_default_a_stored_identity_dropped():
    stored = without_late_defaults(resolve_run_config({"validation": {"split": "samples"}}))["validation"]
    assert "fraction" not in stored and section_value(stored, "validation.fraction") == 0.1
    assert section_value({"fraction": 0.3}, "validation.fraction") == 0.3


def _written_before_the_stand_in_went(resolved: dict) -> dict:
    """A config.yaml as the engine wrote it while model.standin existed: null beside `pretrained`."""
    model = {}
    for key, value in resolved["model"].items():
        model[key] = value
        if key == "pretrained":
            model["standin"] = None
    return yaml.safe_load(dump_yaml({**resolved, "model": model}))


def test_a_retired_key_at_its_value_reads_as_absent():
    """A run directory's config.yaml written while model.standin existed resolves as now."""
    partial = {"model": {"backbone": "tiny_cnn", "pretrained": "digit_trunk", "digit_trunk": {"seed": 1}}}
    resolved = resolve_run_config(partial)
    stored = _written_before_the_stand_in_went(resolved)
    assert stored["model"]["standin"] is None and "standin" not in resolved["model"]
    assert resolve_run_config(stored) == resolved
    assert without_retired_keys(stored) == yaml.safe_load(dump_yaml(resolved))


@pytest.mark.parametrize(
    "model, message",
    [({"standin": {"epochs": 3}}, "unknown key 'model.standin'"), ({"pretrained": "standin"}, "model.pretrained")],
)
def test_the_generated_stand_in_is_refused(model, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run_config({"model": {"backbone": "tiny_cnn", **model}})


def test_record_fields_get_their_defaults_and_numbers_read_as_strings_become_floats():
    resolved = resolve_run_config({"dataset": {"label_noise": {"rate": 0.3}}, "validation": {"fraction": "1e-1"}})
    assert resolved["dataset"]["label_noise"] == {"rate": 0.3, "seed": 0, "mode": "other"}
    assert resolved["validation"]["fraction"] == 0.1


@pytest.mark.parametrize(
    "partial, message",
    [
        (
            {"dataset": {"label_noise": {"rate": 2}}},
            r"dataset\.label_noise\.rate = 2\.0: expected a fraction in \[0, 1\]",
        ),
        ({"dataset": {"label_noise": {"mode": "some"}}}, r"dataset\.label_noise\.mode = 'some': expected one of"),
        (
            {"dataset": {"label_noise": {"rte": 0.3}}},
            r"dataset\.label_noise = .*: expected null or a mapping with rate",
        ),
        ({"dataset": {"hflip": 2}}, r"dataset\.hflip = 2\.0: expected a probability in \[0, 1\]"),
        ({"amp": {"enabled": 1}}, r"amp\.enabled = 1: expected 'auto', true or false"),
        (
            {"dataset": {"sampler": "m_per_class", "batch_size": 18}},
            r"dataset\.batch_size = 18: expected a multiple of",
        ),
    ],
)
def test_table_and_cross_key_checks_name_the_key(partial, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run_config(partial)
