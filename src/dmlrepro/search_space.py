"""The search space of a hyperparameter search (docs/tuning.md): dotted run-config keys -> specs,
parsed and checked (:func:`parse_space`), each a :class:`Param` that asks an optuna trial for its
value. A leaf module: it imports nothing of dmlrepro (dmlrepro.runs checks the spaces of search
experiments at plan time; dmlrepro.tuning.bayes searches them)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ZERO_SUFFIX = "@zero"


@dataclass(frozen=True)
class Param:
    """One searched run-config key (``key`` is dotted, e.g. ``loss.hparams.proxies_per_class``)."""

    key: str
    type: str  # int | float | categorical
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    zero: bool = False
    choices: tuple | None = None

    def spec(self) -> dict[str, Any]:
        """The normalised spec (what the study's fingerprint is computed from)."""
        if self.type == "categorical":
            return {"type": "categorical", "choices": list(self.choices)}
        out = {"type": self.type, "low": self.low, "high": self.high, "log": self.log, "zero": self.zero}
        if self.step is not None:
            out["step"] = self.step
        return out

    def suggest(self, trial) -> tuple[Any, dict[str, Any]]:
        """(the value the run gets, the sampler's raw parameters)."""
        if self.type == "categorical":
            value = trial.suggest_categorical(self.key, list(self.choices))
            return value, {self.key: value}
        raw: dict[str, Any] = {}
        is_zero = False
        if self.zero:
            is_zero = trial.suggest_categorical(self.key + ZERO_SUFFIX, [False, True])
            raw[self.key + ZERO_SUFFIX] = is_zero
        if self.type == "int":
            value = trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        else:
            value = trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)
        raw[self.key] = value
        # with `<key>@zero` the log-range value is still drawn (the sampler sees a fixed space) but unused
        return ((0 if self.type == "int" else 0.0) if is_zero else value), raw

    def example(self) -> Any:
        """A value inside the space (used to check the keys against the run-config schema)."""
        return self.choices[0] if self.type == "categorical" else self.low


_ALLOWED = {
    "int": {"type", "low", "high", "log", "step", "zero"},
    "float": {"type", "low", "high", "log", "step", "zero"},
    "categorical": {"type", "choices"},
}


def is_finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_space(space: Mapping[str, Any]) -> list[Param]:
    """Mapping of dotted run-config keys to specs -> parameters; a bad spec raises ValueError
    naming the key and what is expected. Specs:

    * ``{type: float, low, high, log: false, step: null, zero: false}``
    * ``{type: int, low, high, log: false, step: 1, zero: false}``
    * ``{type: categorical, choices: [...]}`` (None, bool, int, float or str values)

    ``zero: true`` (int/float with ``low > 0``) also searches the value 0: an extra boolean
    parameter ``<key>@zero`` chosen by the sampler; when it is true the run gets 0.
    """
    if isinstance(space, Param):
        raise ValueError("search space: expected a mapping of dotted run-config keys to specs")
    if isinstance(space, (list, tuple)) and all(isinstance(p, Param) for p in space):
        return list(space)
    if not isinstance(space, Mapping) or not space:
        raise ValueError(
            f"search space: expected a non-empty mapping of dotted run-config keys to specs, got {space!r}"
        )
    params = [_parse_param(key, spec) for key, spec in space.items()]
    keys = [p.key for p in params]
    for a in keys:
        for b in keys:
            if a != b and b.startswith(a + "."):
                raise ValueError(f"search space: {b!r} lies inside {a!r}; search one or the other")
    return params


def _parse_param(key: Any, spec: Any) -> Param:
    where = f"search space: {key!r}"
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")) or "@" in key:
        raise ValueError(f"{where}: expected a dotted run-config key such as 'asap.lam' (no '@')")
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: expected a mapping {{type: int|float|categorical, ...}}, got {spec!r}")
    kind = spec.get("type")
    if kind not in _ALLOWED:
        raise ValueError(f"{where}: type = {kind!r}: expected 'int', 'float' or 'categorical'")
    unknown = sorted(set(spec) - _ALLOWED[kind])
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown} for type {kind}; allowed: {sorted(_ALLOWED[kind])}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, (list, tuple)) or not choices:
            raise ValueError(f"{where}: choices = {choices!r}: expected a non-empty list")
        for c in choices:
            if not (c is None or isinstance(c, (bool, int, str)) or (isinstance(c, float) and math.isfinite(c))):
                raise ValueError(f"{where}: choice {c!r}: expected None, a bool, an int, a finite float or a string")
        if len({json.dumps(c) for c in choices}) != len(choices):
            raise ValueError(f"{where}: choices {list(choices)!r} repeat a value")
        return Param(key, "categorical", choices=tuple(choices))
    low, high = spec.get("low"), spec.get("high")
    log, zero, step = spec.get("log", False), spec.get("zero", False), spec.get("step")
    for name, v in (("low", low), ("high", high)):
        if not is_finite_number(v) or (kind == "int" and not float(v).is_integer()):
            raise ValueError(
                f"{where}: {name} = {v!r}: expected {'an integer' if kind == 'int' else 'a finite number'}"
            )
    if not low <= high:
        raise ValueError(f"{where}: low = {low!r} > high = {high!r}: expected low <= high")
    for name, v in (("log", log), ("zero", zero)):
        if not isinstance(v, bool):
            raise ValueError(f"{where}: {name} = {v!r}: expected true or false")
    if log and low <= 0:
        raise ValueError(f"{where}: log: true needs low > 0, got low = {low!r} (use zero: true to also search 0)")
    if zero and low <= 0:
        raise ValueError(f"{where}: zero: true needs low > 0 (0 is then searched as an extra value), got low = {low!r}")
    if step is not None:
        if not is_finite_number(step) or step <= 0 or (kind == "int" and not float(step).is_integer()):
            raise ValueError(
                f"{where}: step = {step!r}: expected a number > 0 ({'an integer' if kind == 'int' else 'float'})"
            )
        if log and (kind == "float" or step != 1):
            raise ValueError(
                f"{where}: step and log: true cannot be combined (optuna samples a log range without steps)"
            )
    if kind == "int":
        return Param(key, "int", int(low), int(high), log, int(step) if step is not None else None, zero)
    return Param(key, "float", float(low), float(high), log, float(step) if step is not None else None, zero)
