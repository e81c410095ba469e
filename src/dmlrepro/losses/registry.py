"""Where every loss declares itself: its name, its paper, its proxies, its lr groups and the
hyperparameters a run config gets filled in (docs/losses.md, "Adding a loss").

A loss module registers each loss with :func:`register_loss`, as a class decorator or a call:

    @register_loss("pfml", paper=PFML, proxies=POTENTIAL_FIELD_PROXIES, config_defaults={"proxies_per_class": 2})
    class PFMLLoss(PotentialFieldLoss): ...

A loss of your own needs no fork: declare it the same way in a module of yours and name it
``loss.name: package.module:ClassName`` (:func:`import_loss`; docs/tasks/own-loss.md). The rest of
the library reads these declarations: ``build_loss`` and the name lists, the proxy
metrics and final_proxies.npz (:mod:`.proxies`), the optimizer's linked groups
(dmlrepro.train.optim), the run config's checks and fill-ins (dmlrepro.train.config) and the model
presets (dmlrepro.models). The config check runs without torch: it reads their generated copy
(:mod:`.catalog`) of :func:`catalog`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Paper:
    """The paper (or code) a loss comes from.

    ``key`` names it in the catalog; with ``readings`` (a page of docs/readings) it is also the prefix
    of that page's anchors (``pfml-r7``, dmlrepro.report.readings); with ``preset`` (build_model's
    pooling/head keys, docs/models.md) it is the name of that model preset (``model.preset``)."""

    key: str
    citation: str
    readings: str | None = None
    preset: Mapping[str, Any] | None = None


def _one_proxy_per_class(loss: nn.Module) -> int:
    return 1


def _as_trained(points: torch.Tensor, loss: nn.Module) -> torch.Tensor:
    return points


@dataclass(frozen=True)
class Proxies:
    """How a loss keeps its proxies.

    ``tensor(loss)``: the (P, D) trained values, row c·K + k = proxy k of class c (final_proxies.npz);
    ``per_class(loss)``: K; ``space(points, loss)``: the points where the loss's distances put them
    (the proxy metrics, W₂ and AvgDTP). ASAP's alternation sets them (``set(loss, values)``, the
    k-Center picks) and sample-based ASAP turns them into a record of embedded samples
    (``use_samples(loss)``); None for a loss whose proxies only train."""

    tensor: Callable[[nn.Module], torch.Tensor]
    per_class: Callable[[nn.Module], int] = _one_proxy_per_class
    space: Callable[[torch.Tensor, nn.Module], torch.Tensor] = _as_trained
    set: Callable[[nn.Module, torch.Tensor], None] | None = None
    use_samples: Callable[[nn.Module], None] | None = None


#: ``lr_groups(loss) -> {name: (params, group, ratio)}``: parameters trained at ``ratio`` × the lr of the
#: config group ``group`` (optimizer group ``loss.<name>``, dmlrepro.train.optim)
LrGroups = Callable[[nn.Module], Mapping[str, tuple[list[nn.Parameter], str, float]]]


@dataclass(frozen=True)
class LossSpec:
    """One loss as config names it.

    ``build(num_classes, embedding_size, **hparams)`` makes it. ``config_defaults`` are filled into
    ``loss.hparams`` when the run config does not give them (the resolved config, hence the run id,
    records them). ``numeric_hparams`` (name -> whether null is allowed) are the hyperparameters the
    config check requires to be numbers; for a class, by default its constructor's parameters
    annotated ``int``/``float``. ``origin`` says where the code comes from (one of :data:`ORIGINS`) and
    ``hparam_defaults`` the builder's defaults where its signature does not show them (``dmlrepro losses``
    prints both)."""

    name: str
    build: Callable[..., nn.Module]
    paper: Paper
    proxies: Proxies | None = None
    lr_groups: LrGroups | None = None
    config_defaults: Mapping[str, Any] = field(default_factory=dict)
    numeric_hparams: Mapping[str, bool] | None = None
    origin: str = "paper"
    hparam_defaults: Mapping[str, Any] | None = None

    def numeric(self) -> dict[str, bool]:
        if self.numeric_hparams is not None:
            return dict(self.numeric_hparams)
        return _annotated_numbers(self.build) if inspect.isclass(self.build) else {}

    def defaults(self) -> dict[str, Any]:
        """The hyperparameters a run gets where its config leaves them out: ``hparam_defaults``, else the
        builder's keyword defaults (a builder taking ``**hparams``: its return class's), then
        ``config_defaults`` over them."""
        found = dict(self.hparam_defaults) if self.hparam_defaults is not None else _keyword_defaults(self.build)
        return {**found, **self.config_defaults}


#: the parameters a builder passes itself, not hyperparameters
_NOT_HPARAMS = {"num_classes", "embedding_size", "base"}


def _keyword_defaults(builder: Callable[..., nn.Module]) -> dict[str, Any]:
    """The builder's parameters with a default; for a function ``build(num_classes, embedding_size, **hparams)``
    annotated to return a class, that class's."""
    try:
        signature = inspect.signature(builder, eval_str=True)
    except NameError:  # an annotation naming what only type checkers import: no return class to follow
        signature = inspect.signature(builder)
    kinds = {param.kind for param in signature.parameters.values()}
    target = signature.return_annotation
    if inspect.Parameter.VAR_KEYWORD in kinds and inspect.isclass(target) and not inspect.isclass(builder):
        signature = inspect.signature(target)
    return {
        name: param.default
        for name, param in signature.parameters.items()
        if param.default is not inspect.Parameter.empty and name not in _NOT_HPARAMS
    }


def _annotated_numbers(cls: type) -> dict[str, bool]:
    """The constructor's parameters after (num_classes, embedding_size) annotated int/float (-> null allowed)."""
    numeric = {}
    for param in list(inspect.signature(cls).parameters.values())[2:]:
        parts = {part.strip() for part in str(param.annotation).split("|")}
        if parts & {"int", "float"} and parts <= {"int", "float", "None"}:
            numeric[param.name] = "None" in parts
    return numeric


#: where a loss's code comes from -> how ``dmlrepro losses`` says it
ORIGINS = {
    "paper": "written from the paper",
    "official code": "a port of the paper's official code",
    "library": "a library's implementation",
}

#: name -> declaration, in registration order
REGISTRY: dict[str, LossSpec] = {}

_registrations = [0]  # how many declarations were made (a key of the catalog's cache)

#: the instance attribute ``build_loss`` tags a built loss with: the name it was built as
BUILT_AS = "_registered_loss"


def register_loss(
    name: str,
    *,
    paper: Paper,
    build: Callable[..., nn.Module] | None = None,
    proxies: Proxies | None = None,
    lr_groups: LrGroups | None = None,
    config_defaults: Mapping[str, Any] | None = None,
    numeric_hparams: Mapping[str, bool] | None = None,
    origin: str = "paper",
    hparam_defaults: Mapping[str, Any] | None = None,
):
    """Declare loss ``name``. Without ``build``, a class decorator (the class is the builder);
    with it, registers at once and returns the builder. A name or paper key taken by another
    declaration, or an ``origin`` not in :data:`ORIGINS`, is a ValueError."""
    if origin not in ORIGINS:
        raise ValueError(f"loss {name!r}: origin {origin!r} is not one of {sorted(ORIGINS)}")

    def declare(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in REGISTRY:
            raise ValueError(f"loss {name!r} is registered twice")
        for other in REGISTRY.values():
            if other.paper.key == paper.key and other.paper != paper:
                raise ValueError(f"loss {name!r}: paper key {paper.key!r} names another paper (loss {other.name!r})")
        REGISTRY[name] = LossSpec(
            name,
            builder,
            paper,
            proxies,
            lr_groups,
            dict(config_defaults or {}),
            numeric_hparams,
            origin,
            hparam_defaults,
        )
        _registrations[0] += 1
        return builder

    return declare if build is None else declare(build)


def loss_names() -> tuple[str, ...]:
    return tuple(sorted(REGISTRY))


def loss_spec(name: str) -> LossSpec:
    """The declaration of loss ``name``, or of the import path ``package.module:Name``
    (:func:`import_loss`); ValueError naming the known losses for any other."""
    if name not in REGISTRY and is_import_path(name):
        return import_loss(name)
    if name not in REGISTRY:
        raise ValueError(
            f"unknown loss {name!r}; known losses: {', '.join(loss_names())}; a loss of your own: "
            "package.module:ClassName (docs/tasks/own-loss.md)"
        )
    return REGISTRY[name]


def is_import_path(name: str) -> bool:
    """Whether ``name`` is a loss's import path, ``package.module:Name`` (no built-in name has a colon)."""
    return ":" in name


def import_loss(path: str) -> LossSpec:
    """The declaration of the loss at import path ``package.module:Name``, a user's loss outside dmlrepro:
    imports the module (whose ``register_loss`` declares it) and registers the declaration under the path
    too, so that the run config, hence the run id, names the code it runs. ValueError saying what is wrong:
    a path that is not ``module:Name``, a module that does not import, a name it lacks or never declared."""
    if path in REGISTRY:
        return REGISTRY[path]
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise ValueError(f"loss {path!r}: expected an import path package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"loss {path!r}: cannot import {module_name!r} ({error}); install it or put its folder on PYTHONPATH"
        ) from error
    builder = getattr(module, attribute, None)
    if builder is None:
        raise ValueError(f"loss {path!r}: module {module_name!r} has no {attribute!r}")
    declared = next((entry for entry in REGISTRY.values() if entry.build is builder), None)
    if declared is None:
        raise ValueError(f"loss {path!r}: {attribute} is not declared; decorate it with dmlrepro.losses.register_loss")
    REGISTRY[path] = dataclasses.replace(declared, name=path)
    _registrations[0] += 1
    return REGISTRY[path]


def spec_of(loss: nn.Module) -> LossSpec | None:
    """The declaration a loss was built from (``build_loss``: its name or import path), or the one whose
    builder is its class; None for a module no declaration builds."""
    name = getattr(loss, BUILT_AS, None)
    if name in REGISTRY:
        return REGISTRY[name]
    return next((entry for entry in REGISTRY.values() if entry.build is type(loss)), None)


def catalog() -> tuple[dict[str, dict], dict[str, dict]]:
    """(losses, papers) as plain data, read-only: per loss its paper key, whether it has proxies, whether
    ASAP can set them or replace them by samples, and its config defaults; per paper its citation,
    readings page and model preset."""
    return _catalog(_registrations[0], tuple(REGISTRY))


@functools.lru_cache(maxsize=8)
def _catalog(registrations: int, names: tuple[str, ...]) -> tuple[dict[str, dict], dict[str, dict]]:
    """Cached per state of the registry: the registrations so far and the names registered now."""
    specs = [REGISTRY[name] for name in names]
    losses = {}
    for spec in sorted(specs, key=lambda spec: spec.name):
        proxies = spec.proxies
        losses[spec.name] = {
            "paper": spec.paper.key,
            "has_proxies": proxies is not None,
            "sets_proxies": proxies is not None and proxies.set is not None,
            "sample_proxies": proxies is not None and proxies.use_samples is not None,
            "config_defaults": dict(spec.config_defaults),
        }
    papers = {spec.paper.key: spec.paper for spec in specs}
    return losses, {
        key: {
            "citation": paper.citation,
            "readings": paper.readings,
            "preset": None if paper.preset is None else dict(paper.preset),
        }
        for key, paper in sorted(papers.items())
    }
