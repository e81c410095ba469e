"""What the workflow builds from a config (docs/workflow.md#targets): the active experiments, each on
the datasets that are selected (config `only_datasets`) and can be prepared here; the others are
"not run", with the reason. A target narrows this to one paper or one experiment (:func:`target_scopes`).

A dataset can be prepared when it is prepared already, generated (synthetic, digits), when the config's
``sources`` give it a URL or a local file, or when each of its files is either placed in
``<data_root>/<name>/archives/`` or has a download URL (dmlrepro.data.benchmarks). Cars-196 and In-Shop
have no working URL: without their files placed they are left out, and one missing dataset never blocks
the experiments of the others.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dmlrepro.data.benchmarks import BENCHMARKS
from dmlrepro.data.multidigit import prepared_dependencies
from dmlrepro.data.prepared import ARCHIVE_DIR, dataset_dir, is_prepared
from dmlrepro.data.registry import EMBEDDED
from dmlrepro.runs import ExperimentError, active_experiments, with_schema_defaults

#: the papers, each a prefix of its experiments' names (pfml_table1, rsw_fig6_alpha, asap_table2)
PAPERS = ("pfml", "rsw", "asap")

PREPARED, GENERATED, PLACED, DOWNLOAD, MANUAL = "prepared", "generated", "placed", "download", "manual"


@dataclass(frozen=True)
class DatasetStatus:
    """A dataset's preparation status: prepared, generated (no network), placed (its files are in its
    archives folder), download (fetched when prepared) or manual (files to fetch by hand: `fetch`)."""

    name: str
    status: str
    fetch: str = ""

    @property
    def usable(self) -> bool:
        return self.status != MANUAL


def dataset_status(name: str, data_root: str, source: Mapping[str, Any] | None = None) -> DatasetStatus:
    """Where dataset `name` stands under `data_root` (module docstring); `source`: its entry of the
    config's `sources`, whose `url` or `archive` stands for the files' built-in download."""
    if name in EMBEDDED:
        return DatasetStatus(name, GENERATED)
    if is_prepared(data_root, name):
        return DatasetStatus(name, PREPARED)
    if prepared_dependencies(name):  # double_mnist, triple_mnist: made from mnist (docs/data.md#multi-digit-mnist)
        return dataclasses.replace(dataset_status(prepared_dependencies(name)[0], data_root), name=name)
    bench = BENCHMARKS[name]
    folder = dataset_dir(data_root, name) / ARCHIVE_DIR
    if source and (source.get("url") or source.get("archive")):
        return DatasetStatus(name, DOWNLOAD)
    if any(not (folder / r.filename).is_file() and not r.urls for r in bench.resources):
        fetch = (
            f"no working download: put its files in {folder}/ ({bench.placement}), "
            f"then `dmlrepro prepare {name} --root {data_root}` (docs/data.md)"
        )
        return DatasetStatus(name, MANUAL, fetch)
    placed = all((folder / r.filename).is_file() for r in bench.resources)
    return DatasetStatus(name, PLACED if placed else DOWNLOAD)


@dataclass
class Selection:
    """The experiments built (`experiments`, in the config's order), the config with each experiment's
    datasets narrowed to those it runs on (`config`), and the reasons of what is left out of the active
    experiments (`reasons`: experiment -> one line; an experiment built on part of its datasets has one too)."""

    config: dict[str, Any]
    experiments: list[str]
    active: list[str]  # every active experiment, built or not
    reasons: dict[str, str] = field(default_factory=dict)

    def without(self, reasons: Mapping[str, str]) -> Selection:
        """This selection less the experiments in ``reasons`` (experiment -> why), which join the not-run
        list (e.g. the experiments with a failed run: dmlrepro.run_failures)."""
        kept = [name for name in self.experiments if name not in reasons]
        return dataclasses.replace(self, experiments=kept, reasons={**self.reasons, **reasons})

    def not_run(self, scope: Sequence[str] | None = None) -> list[dict[str, str]]:
        """[{experiment, reason}] of the experiments in `scope` (default: all) not built or built in part."""
        return [
            {"experiment": name, "reason": reason}
            for name, reason in self.reasons.items()
            if scope is None or name in scope
        ]


def select(config: Mapping[str, Any], status: Callable[[str], DatasetStatus] | None = None) -> Selection:
    """The active experiments on their selected, preparable datasets (module docstring). `status`:
    dataset name -> DatasetStatus (default: :func:`dataset_status` under the config's data_root;
    :func:`assume_preparable`: as if every dataset were prepared)."""
    config = with_schema_defaults(config)
    only = config.get("only_datasets")
    unknown = sorted(set(only or ()) - set(config["datasets"]))
    if unknown:
        raise ExperimentError(
            f"config only_datasets: {unknown[0]!r} is not a dataset of the config ({', '.join(config['datasets'])})"
        )
    status = status or (lambda name: dataset_status(name, config["data_root"], config["sources"].get(name)))
    left_out = {}  # dataset -> why
    for name in config["datasets"]:
        if only is not None and name not in only:
            left_out[name] = f"not selected (config only_datasets = [{', '.join(only)}])"
        elif not (state := status(name)).usable:
            left_out[name] = f"not prepared, {state.fetch}"
    narrowed = copy.deepcopy(config)
    built, reasons, active = [], {}, active_experiments(config)
    for name in active:
        datasets = config["experiments"][name]["datasets"]
        kept = [d for d in datasets if d not in left_out]
        narrowed["experiments"][name]["datasets"] = kept
        dropped = [d for d in datasets if d in left_out]
        if dropped:
            why = "; ".join(f"{d}: {left_out[d]}" for d in dropped)
            reasons[name] = why if not kept else f"built without {', '.join(dropped)} ({why})"
        if kept or not datasets:
            built.append(name)
    return Selection(narrowed, built, active, reasons)


def assume_preparable(name: str) -> DatasetStatus:
    """A `status` for :func:`select`: every dataset as if prepared (what a target asks for in full)."""
    return DatasetStatus(name, PREPARED)


def paper_of(experiment: str) -> str | None:
    """The paper an experiment reproduces, from its name's prefix (None: no paper's)."""
    prefix = experiment.split("_", 1)[0]
    return prefix if prefix in PAPERS else None


def target_scopes(experiments: Sequence[str], reserved: Sequence[str] = ()) -> dict[str, list[str]]:
    """Workflow target -> the experiments its report shows: each paper with experiments, and each
    experiment alone, but one named like a paper or a `reserved` name (the workflow's rules, e.g. an
    experiment `search`), which is built by `all` and its paper's target only."""
    scopes = {paper: [e for e in experiments if paper_of(e) == paper] for paper in PAPERS}
    taken = set(PAPERS) | set(reserved)
    return {**{p: names for p, names in scopes.items() if names}, **{e: [e] for e in experiments if e not in taken}}
