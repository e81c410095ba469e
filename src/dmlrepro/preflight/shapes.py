"""Run shapes: the runs of a workflow config grouped by what selects code or tensor shapes.

Two runs share a shape when their resolved configs differ only in values that change numbers, not
the code path or a tensor's shape: seeds, learning rates and other float hyperparameters, epoch
counts, the validation fold, patience. Everything else tells shapes apart: backbone and weights,
pooling / head preset, embedding size, image size and transforms, the loss and the structure of
its hyperparameters (their keys and kinds, their strings and booleans: not their numbers),
optimizer groups and name, AMP, the validation / ASAP / followup modes, the batch size, and the
dataset's number of training classes by order of magnitude (CUB-200 and Cars-196 share shapes).
One representative run per shape is built and stepped (dmlrepro.preflight.stepping); the runs are
the run table's (dmlrepro.run_table.RunTable), a final stage's at the search space's example point.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dmlrepro.data.benchmarks import BENCHMARKS
from dmlrepro.run_table import RunTable
from dmlrepro.runs import ExperimentError, Run, active_experiments
from dmlrepro.train.config import RUNTIME_KEYS

#: dotted paths whose value never selects code or a tensor shape (counts, indices, patience)
VALUE_PATHS = frozenset(
    {
        "seed",
        "epochs",
        "steps_per_epoch",
        "checkpoint",
        "divergence",
        "validation.fold",
        "validation.n_folds",
        "validation.patience",
        "schedule.step",
        "dataset.length_before_new_iter",
        "dataset.label_noise.seed",
        "asap.b",
        "asap.projection_patience",
        "asap.max_alternations",
        "asap.save_val_embeddings",
        # what the evaluation reports beside retrieval (each run's projection counts its cost)
        "eval.ks",
        "eval.every",
        "eval.before_training",
        "eval.select",
        "eval.proxy_metrics",
        "eval.proxy_metrics_per_epoch",
        "eval.w_power",
        "eval.corruptions",
    }
)
#: dotted paths where only "set or not" selects code (a warm-up epoch, a followup phase, noisy labels)
SWITCH_PATHS = frozenset({"warmup_epochs", "followup.epochs", "dataset.label_noise", "dataset.label_noise_file"})
#: sections whose numbers are values (the loss's hyperparameters: their keys and kinds are the structure)
VALUE_SECTIONS = frozenset({"loss.hparams", "followup.loss"})
#: where and how fast a run runs (the preflight sets these itself)
_RUNTIME = frozenset(key if section is None else f"{section}.{key}" for section, key in RUNTIME_KEYS)


@dataclass
class Shape:
    """One run shape: its key, a readable name, and its runs (the first is the representative)."""

    key: str
    name: str
    runs: list[Run] = field(default_factory=list)
    searches: set[str] = field(default_factory=set)  # run ids of the runs that are searches
    finals: set[str] = field(default_factory=set)  # run ids of final-stage stand-ins (RunTable.example_final_runs)

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0].config


@dataclass
class Unresolved:
    """An experiment whose runs do not resolve (a bad value in the config): a failed shape."""

    name: str
    error: str


def shape_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved run config that selects code or tensor shapes (module docstring).
    A benchmark counts by the order of magnitude of its training classes (the proxies' and class
    weights' size: CUB-200 and Cars-196 alike, SOP and In-Shop alike), not by its name."""
    shape = _strip(config, "")
    classes = train_classes(config["dataset"]["name"])
    if classes is not None:
        shape["dataset"]["name"] = f"~1e{round(math.log10(classes))} classes"
    return shape


def train_classes(dataset: str) -> int | None:
    """The published number of training classes of a benchmark (None: an embedded dataset)."""
    return BENCHMARKS[dataset].expected_counts["train_classes"] if dataset in BENCHMARKS else None


def _strip(value: Any, path: str, values: bool = False) -> Any:
    if path in VALUE_PATHS or path in _RUNTIME:
        return _DROP
    if path in SWITCH_PATHS:
        return bool(value)
    values = values or path in VALUE_SECTIONS
    if isinstance(value, Mapping):
        out = {key: _strip(item, f"{path}.{key}" if path else str(key), values) for key, item in value.items()}
        return {key: item for key, item in out.items() if item is not _DROP}
    if isinstance(value, (list, tuple)):
        return [_strip(item, path, values) for item in value]
    if isinstance(value, float) or (values and isinstance(value, int) and not isinstance(value, bool)):
        return f"<{type(value).__name__}>"  # a value, not a structure: learning rates, margins, proxy counts
    return value


_DROP = object()


def shape_key(config: Mapping[str, Any]) -> str:
    text = json.dumps(shape_of(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def shape_name(config: Mapping[str, Any], datasets: list[str] | None = None) -> str:
    """A short readable label: datasets, backbone, head preset, embedding size, image size, batch,
    loss (+ the modes that set a shape apart)."""
    d, m = config["dataset"], config["model"]
    parts = [
        "+".join(datasets or [d["name"]]),
        str(m["backbone"]),
        m.get("preset") or m.get("head") or "linear",
        f"{m['embedding_size']}d",
        f"{d['image_size']}px",
        f"b{d['batch_size']}",
        config["loss"]["name"],
    ]
    if config.get("asap", {}).get("enabled"):
        parts.append(f"asap-{config['asap'].get('proxies', 'trainable')}")
    if config.get("validation", {}).get("split"):
        parts.append(f"val-{config['validation']['split']}")
    return "/".join(parts)


def group_runs(
    config: Mapping[str, Any], experiments: list[str] | None = None
) -> tuple[list[Shape], list[Unresolved], dict[str, list[str]]]:
    """(shapes, experiments that do not resolve, experiment -> its run ids) of the named
    experiments (default: the active ones): each experiment's entries of the run table
    (dmlrepro.run_table.RunTable: its runs, its searches' base runs, which rule search trains, and
    stand-ins for its final stage). Each experiment is resolved on its own, so one bad experiment
    fails alone."""
    names = active_experiments(config) if experiments is None else list(experiments)
    runs: dict[str, Run] = {}
    searches: set[str] = set()
    finals: set[str] = set()
    unresolved: list[Unresolved] = []
    members: dict[str, list[str]] = {}
    for name in names:
        try:
            table = RunTable(config, [name])
            final = table.example_final_runs(name)
        except (ExperimentError, ValueError, KeyError, TypeError) as error:
            unresolved.append(Unresolved(name, f"{type(error).__name__}: {error}"))
            continue
        searches.update(table.searches)
        finals.update(final)
        members[name] = [*table.runs, *table.searches, *final]
        for run_id, run in {**table.runs, **table.searches, **final}.items():
            runs.setdefault(run_id, run).experiments.update(run.experiments)
    shapes: dict[str, Shape] = {}
    for run_id, run in runs.items():
        key = shape_key(run.config)
        shape = shapes.setdefault(key, Shape(key, ""))
        shape.runs.append(run)
        if run_id in searches:
            shape.searches.add(run_id)
        if run_id in finals:
            shape.finals.add(run_id)
    for shape in shapes.values():  # the representative: the run with the most classes (largest proxy tensors)
        shape.runs.sort(key=lambda run: -(train_classes(run.dataset) or 0))
    _unique_names(list(shapes.values()))
    return list(shapes.values()), unresolved, members


def _unique_names(shapes: list[Shape]) -> None:
    """Each shape's name from its representative; names that coincide get the key appended."""
    seen: dict[str, int] = {}
    for shape in shapes:
        shape.name = shape_name(shape.config, list(dict.fromkeys(run.dataset for run in shape.runs)))
    for shape in shapes:
        seen[shape.name] = seen.get(shape.name, 0) + 1
    for shape in shapes:
        if seen[shape.name] > 1:
            shape.name = f"{shape.name}#{shape.key[:6]}"
