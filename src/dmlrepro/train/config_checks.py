"""The checks a run-config key can have: each is called as ``check(key, value)``, returns the value
as the resolved config records it (``1e-4`` read as a string becomes a float, a path a string) or
raises :class:`ConfigError`, and ``describe()`` says in words what it accepts (docs/training.md's
key tables). The keys themselves, with their checks, are in ``config_keys``.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dmlrepro.config_names import CORRUPTION_NAMES, WEIGHT_NAMES, canonical_backbone, nmi_options

#: Parameter groups of the optimizer: the trunk, the rest of the model, the loss's own
#: parameters (proxies, class weights).
GROUPS = ("backbone", "head", "loss")


class ConfigError(ValueError):
    """A bad run config: the message names the key, the value and what was expected."""


def config_error(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"run config: {key} = {value!r}: expected {expected}")


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """The YAML document in ``path``; a syntax error or a file that is not UTF-8 is a
    :class:`ConfigError` of one line naming the file, the line and column, and the problem."""
    import yaml  # deferred: only the loaders need it

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        context = getattr(error, "context", None)
        raise ConfigError(
            f"{path}{where}: not valid YAML ({problem}{'; ' + context if context else ''}); expected a {what} in YAML"
        ) from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); expected a {what} in YAML"
        ) from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numeric_loss_hparams(name: str) -> dict[str, bool]:
    """The hyperparameters of loss ``name`` that are numbers (-> whether null is allowed), as the loss
    declares them (dmlrepro.losses.registry)."""
    from dmlrepro.losses import loss_spec  # deferred: imports torch

    return loss_spec(name).numeric()


def check_loss_hparam_types(name: str, hparams: Mapping[str, Any]) -> None:
    """A numeric hyperparameter given as something else (``alpha: "four"``) names its key."""
    for key, allows_null in numeric_loss_hparams(name).items():
        if key in hparams and not (_is_number(hparams[key]) or (allows_null and hparams[key] is None)):
            raise config_error(
                f"loss.hparams.{key}", hparams[key], f"a number{' or null' if allows_null else ''} (loss {name!r})"
            )


def _md(value: Any) -> str:
    """A value as docs/training.md writes it: YAML spelling in backticks."""
    if value is None or isinstance(value, bool):
        value = {None: "null", True: "true", False: "false"}[value]
    return f"`{value}`"


@dataclass(frozen=True)
class Choice:
    """One of a fixed set. ``options`` is the set, or "module:NAME" naming it where importing it is
    heavy (torch) and so is deferred to the check."""

    options: Sequence[Any] | str
    or_null: bool = False

    def allowed(self) -> Sequence[Any]:
        if isinstance(self.options, str):
            module, name = self.options.split(":")
            return getattr(importlib.import_module(module), name)
        return self.options

    def __call__(self, key: str, value: Any) -> Any:
        if value is None and self.or_null:
            return value
        allowed = self.allowed()
        if value not in allowed:
            raise config_error(key, value, f"one of {list(allowed)}")
        return value

    def describe(self) -> str:
        if isinstance(self.options, str):
            text = f"a name in `{self.options.replace(':', '.')}`"
        else:
            text = ", ".join(_md(option) for option in self.options)
        return text + (", or `null`" if self.or_null else "")


@dataclass(frozen=True)
class Number:
    """A finite number (an integer with ``integer``), at least ``low`` (above it with ``low_open``),
    at most ``high`` (below it with ``high_open``; ``high_expected`` is the error's wording)."""

    integer: bool = False
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    high_expected: str = ""
    or_null: bool = False

    def __call__(self, key: str, value: Any) -> Any:
        if value is None and self.or_null:
            return value
        if isinstance(value, str) and not self.integer:  # PyYAML reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        right_type = isinstance(value, int) if self.integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not right_type or (not self.integer and not math.isfinite(value)):
            kind = "an integer" if self.integer else "a finite number"
            raise config_error(key, value, kind + (" or null" if self.or_null else ""))
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            raise config_error(key, value, f"a number {'>' if self.low_open else '>='} {self.low}")
        value = value if self.integer else float(value)
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            raise config_error(key, value, self.high_expected)
        return value

    def describe(self) -> str:
        text = "integer" if self.integer else "number"
        if self.low is not None:
            text += f" {'>' if self.low_open else '≥'} {self.low}"
        if self.high is not None:
            text += f", {'<' if self.high_open else '≤'} {self.high}"
        return text + (", or `null`" if self.or_null else "")


@dataclass(frozen=True)
class LossName:
    """``loss.name``: a registered loss (``dmlrepro losses``), or the import path ``package.module:ClassName`` of
    a loss of your own declared with ``register_loss`` (imported here, which imports torch; docs/tasks/own-loss.md)."""

    def __call__(self, key: str, value: Any) -> Any:
        if isinstance(value, str) and ":" in value:
            from dmlrepro.losses.registry import import_loss  # deferred: imports torch, only for a user's loss

            try:
                import_loss(value)
            except ValueError as error:
                reason = str(error).removeprefix(f"loss {value!r}: ")
                raise ConfigError(f"run config: {key} = {value!r}: {reason}") from None
            return value
        return Choice("dmlrepro.config_names:LOSS_NAMES")(key, value)

    def describe(self) -> str:
        return "a name in `dmlrepro.config_names.LOSS_NAMES`, or an import path `package.module:ClassName`"


@dataclass(frozen=True)
class Flag:
    """``true`` or ``false``; with ``auto`` also the string "auto" (resolved at run time)."""

    auto: bool = False

    def __call__(self, key: str, value: Any) -> Any:
        if isinstance(value, bool) or (self.auto and value == "auto"):
            return value
        raise config_error(key, value, "'auto', true or false" if self.auto else "true or false")

    def describe(self) -> str:
        return "`auto`, `true`, `false`" if self.auto else "`true`, `false`"


@dataclass(frozen=True)
class AnyMapping:
    """A mapping whose keys another part checks (a loss's keyword arguments, a builder's)."""

    expected: str = "a mapping"

    def __call__(self, key: str, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise config_error(key, value, self.expected)
        return value

    def describe(self) -> str:
        return "mapping"


@dataclass(frozen=True)
class Custom:
    """A check written as a function ``(key, value) -> value``; ``text`` describes it."""

    function: Callable[[str, Any], Any]
    text: str

    def __call__(self, key: str, value: Any) -> Any:
        return self.function(key, value)

    def describe(self) -> str:
        return self.text


@dataclass(frozen=True)
class Record:
    """``null`` or a mapping of named fields, each with a default and a check (``fields``: ``Key``s of
    ``config_keys`` named relative to this one); the missing fields get their defaults."""

    fields: tuple
    expected: str

    def defaults(self) -> dict[str, Any]:
        return {field.name: field.default for field in self.fields}

    def __call__(self, key: str, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping) or set(value) - {field.name for field in self.fields}:
            raise config_error(key, value, self.expected)
        value = {**self.defaults(), **value}
        for field in self.fields:
            value[field.name] = field.check(f"{key}.{field.name}", value[field.name])
        return value

    def describe(self) -> str:
        return "`null` or a mapping (below)"


# -- checks of structured values ---------------------------------------------------------------------
def path_string(expected: str, or_null: bool = False, may_be_empty: bool = False) -> Custom:
    """A file or folder path (str or os.PathLike), recorded as a string."""

    def check(key: str, value: Any) -> Any:
        if value is None and or_null:
            return value
        if not isinstance(value, (str, os.PathLike)) or not (str(value) or may_be_empty):
            raise config_error(key, value, expected)
        return str(value)

    return Custom(check, "path" + (", or `null`" if or_null else ""))


def _is_pair(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(x, (int, float)) for x in value)


def crop_range(key: str, value: Any) -> list[float]:
    """dataset.scale / dataset.ratio: RandomResizedCrop's [low, high]."""
    if not (_is_pair(value) and 0 < value[0] <= value[1]):
        raise config_error(key, value, "a pair [low, high] with 0 < low <= high")
    return [float(x) for x in value]


def adam_betas(key: str, value: Any) -> list[float]:
    if not (_is_pair(value) and all(0 <= x < 1 for x in value)):
        raise config_error(key, value, "a pair [beta1, beta2] in [0, 1)")
    return [float(x) for x in value]


def group_multipliers(key: str, value: Any) -> Any:
    """A multiplier >= 0 per parameter group (optimizer.lr_mult, wd_mult, followup.lr_mult)."""
    if not isinstance(value, Mapping):
        raise config_error(key, value, f"a mapping with keys among {list(GROUPS)}")
    for group, multiplier in value.items():
        if group not in GROUPS:
            raise config_error(f"{key}.{group}", multiplier, f"a group name among {list(GROUPS)}")
        if (
            isinstance(multiplier, bool)
            or not isinstance(multiplier, (int, float))
            or not math.isfinite(multiplier)
            or multiplier < 0
        ):
            raise config_error(f"{key}.{group}", multiplier, "a finite number >= 0")
    return value


def group_list(key: str, value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(group in GROUPS for group in value):
        raise config_error(key, value, f"a list of group names among {list(GROUPS)}")
    return list(value)


def recall_ks(key: str, value: Any) -> list[int]:
    """eval.ks: the Recall@K cut-offs, sorted, without repeats; 1 among them."""
    if not (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in value)
    ):
        raise config_error(key, value, "a non-empty list of integers >= 1")
    ks = sorted(set(int(k) for k in value))
    if 1 not in ks:
        raise config_error(key, ks, "a list containing 1 (recall@1 is logged and used by select)")
    return ks


def subset_of(options: Sequence[str]) -> Custom:
    def check(key: str, value: Any) -> Any:
        if not (isinstance(value, (list, tuple)) and set(value) <= set(options)):
            raise config_error(key, value, f"a list of {tuple(options)}")
        return value

    return Custom(check, "list of " + ", ".join(_md(option) for option in options))


def nmi_setting(key: str, value: Any) -> Any:
    try:
        nmi_options(value)
    except ValueError as exc:
        raise config_error(key, value, str(exc)) from None
    return value


def corruption_list(key: str, value: Any) -> list[dict]:
    """eval.corruptions: a list of {name, severity} (RSW Table IV, dmlrepro.data.corruptions)."""
    if not isinstance(value, (list, tuple)):
        raise config_error(key, value, "a list of {name, severity} mappings")
    out, seen = [], set()
    for item in value:
        if not isinstance(item, Mapping) or set(item) - {"name", "severity"} or "name" not in item:
            raise config_error(key, item, "a mapping with keys name (and severity)")
        name, severity = item["name"], item.get("severity")
        if name not in CORRUPTION_NAMES:
            raise config_error(f"{key}[].name", name, f"one of {sorted(CORRUPTION_NAMES)}")
        if severity is not None and (isinstance(severity, bool) or severity not in (1, 2, 3, 4, 5)):
            raise config_error(f"{key}[].severity", severity, "null (imgaug's default range) or an integer 1..5")
        if (name, severity) in seen:
            raise config_error(key, item, "each {name, severity} at most once")
        seen.add((name, severity))
        out.append({"name": name, "severity": severity})
    return out


def backbone_name(key: str, value: Any) -> Any:
    try:
        canonical_backbone(str(value))
    except KeyError as e:
        raise ConfigError(f"run config: {key} = {value!r}: {e.args[0]}") from None
    return value


def pretrained_weights(key: str, value: Any) -> Any:
    if not isinstance(value, (bool, str)):
        raise config_error(key, value, "false, true or a weight name")
    if isinstance(value, str) and value not in [*WEIGHT_NAMES, "digit_trunk"]:
        raise config_error(key, value, f"digit_trunk or a weight name among {list(WEIGHT_NAMES)}")
    return value


def device_name(key: str, value: Any) -> Any:
    if not isinstance(value, str) or not (value in ("auto", "cpu", "cuda") or value.startswith("cuda:")):
        raise config_error(key, value, "'auto', 'cpu', 'cuda' or 'cuda:N'")
    return value


def worker_count(key: str, value: Any) -> Any:
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise config_error(key, value, "an integer >= 0 or 'auto'")
    return value
