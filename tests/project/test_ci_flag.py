"""tests/conftest.py `require`: under CI (any CI value the common CI systems set, or CI=1 by hand) a
missing integration component fails the test; elsewhere it skips it (docs/testing.md)."""

from __future__ import annotations

import pytest

from ..conftest import MissingComponent, in_ci, require


@pytest.mark.parametrize("value", ["true", "1", "True", "TRUE", "yes", "woodpecker", " true "])
def test_ci_values_the_ci_systems_set_are_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(MissingComponent, match=f"CI={value} and a required integration check cannot run: no X"):
        require("no X")


@pytest.mark.parametrize("value", [None, "", "0", "false", "False", "no", "off"])
def test_an_unset_or_false_ci_is_not_ci(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match="no X"):
        require("no X")
    require(None)  # the component is there: nothing happens
