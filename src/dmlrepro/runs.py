"""Experiments → runs: the run table of the pipeline (docs/workflow.md, docs/architecture.md).

An experiment names methods × datasets × seeds × a sweep grid; each combination is a partial
run config built by deep-merging, in order,

    defaults  ←  datasets[dataset]  ←  methods[method]  ←  methods[method].per_dataset[dataset]
              ←  experiment.overrides  ←  experiment.method_overrides[method]  ←  sweep point  ←  {seed}

and then resolved (every default filled, every value checked) by
`dmlrepro.train.config.resolve_run_config`. A run's identity is that resolved config without
the keys that only say *where* or *how fast* (data root, weight cache, device, workers,
threads): the run id is a readable prefix plus a hash of it. Equal configs therefore share one
run across experiments, and changing one hyperparameter makes new ids only for the runs whose
resolved config it changes.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmlrepro.nested import canonical, deep_merge, dotted
from dmlrepro.train.config import (
    ConfigError,
    config_identity,
    resolve_run_config,
    without_late_defaults,
)
from dmlrepro.train.config_checks import read_yaml

HASH_LENGTH = 10
#: The workflow's config schema in the checkout this package lives in (rule files validate against it).
SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class ExperimentError(ValueError):
    """A bad experiment definition; the message names the experiment and the key."""


@dataclass
class Run:
    run_id: str
    method: str
    dataset: str
    seed: int
    config: dict[str, Any]
    experiments: dict[str, dict[str, Any]] = field(default_factory=dict)  # experiment -> its sweep point
    position: dict[str, int] = field(default_factory=dict)  # experiment -> place in its declared order


def job_runtime(data_root: str, threads: int, cache_images: bool) -> dict:
    """What a workflow job (rule train, rule search) adds to its run config: the prepared data under
    `data_root` (rule prepare_dataset made it, so the engine's prepare step only finds it), image
    caching and torch's threads; all RUNTIME_KEYS, none part of a run's identity."""
    return {"dataset": {"root": data_root, "prepare": True, "cache_images": cache_images}, "threads": threads}


def config_hash(resolved: Mapping[str, Any]) -> str:
    text = json.dumps(config_identity(resolved), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", str(value)).strip("_")


def run_id_for(method: str, dataset: str, resolved: Mapping[str, Any]) -> str:
    """Readable prefix (method, dataset, backbone, seed) + hash of the run's identity."""
    backbone = resolved["model"]["backbone"]
    return f"{_slug(method)}-{_slug(dataset)}-{_slug(backbone)}-s{resolved['seed']}-{config_hash(resolved)}"


def _sweep_points(sweep: Mapping[str, list]) -> list[dict[str, Any]]:
    keys = list(sweep)
    return [dict(zip(keys, values)) for values in itertools.product(*(sweep[k] for k in keys))]


def _section(config: Mapping, name: str, key: str, where: str) -> Mapping:
    table = config.get(name) or {}
    if key not in table:
        raise ExperimentError(f"{where}: unknown {name[:-1]} {key!r}; config.{name} defines {sorted(table)}")
    return table[key] or {}


def resolve_runs(config: Mapping[str, Any], experiments: list[str] | None = None) -> dict[str, Run]:
    """Every run of the named experiments (default: the active ones), keyed by run id, deduplicated.
    Search experiments (`search:`, trained inside their search) have no runs here:
    dmlrepro.tuning.searches.search_runs; the workflow's whole table: dmlrepro.run_table.RunTable."""
    config = with_schema_defaults(config)
    names = [name for name in experiment_names(config, experiments) if "search" not in config["experiments"][name]]
    runs: dict[str, Run] = {}
    for name, position, run in experiment_points(config, names):
        add_run(runs, name, position, run)
    return runs


def add_run(runs: dict[str, Run], name: str, position: int, run: Run) -> None:
    """Put `run` into `runs` as experiment `name`'s run at `position` (a run another experiment
    already has keeps both experiments)."""
    point = run.experiments.pop(name)
    run = runs.setdefault(run.run_id, run)
    run.experiments[name], run.position[name] = point, position


def active_experiments(config: Mapping[str, Any]) -> list[str]:
    """The experiments the workflow builds: all but the opt-in ones (`opt_in: true`, or the name of a
    group of them) that the top-level `opt_in` list names neither alone nor by their group."""
    config = with_schema_defaults(config)
    experiments, chosen = config["experiments"], set(config["opt_in"])
    groups = {exp["opt_in"] for exp in experiments.values() if isinstance(exp["opt_in"], str)}
    offered = {name for name, exp in experiments.items() if exp["opt_in"]}
    unknown = sorted(chosen - offered - groups)
    if unknown:
        raise ExperimentError(
            f"opt_in: {unknown[0]!r} is neither an experiment marked opt_in nor a group of them; "
            f"those are {sorted(offered)}, the groups {sorted(groups)}"
        )
    return [name for name, exp in experiments.items() if not exp["opt_in"] or {name, exp["opt_in"]} & chosen]


def experiment_names(config: Mapping[str, Any], experiments: list[str] | None) -> list[str]:
    """The named experiments (default: the active ones), each checked to exist (and a final stage to
    follow a search)."""
    names = active_experiments(config) if experiments is None else list(experiments)
    for name in names:
        if name not in config["experiments"]:
            raise ExperimentError(
                f"unknown experiment {name!r}; config.experiments defines {sorted(config['experiments'])}"
            )
        if "final" in config["experiments"][name] and "search" not in config["experiments"][name]:
            raise ExperimentError(
                f"experiments.{name}.final: a final stage trains a search's best point; "
                f"experiments.{name} has no search"
            )
    return names


def experiment_points(config: Mapping[str, Any], experiments: list[str]):
    """(experiment, position, Run) for every combination of the named experiments, in order.
    `config` has the schema's defaults (`with_schema_defaults`)."""
    for name in experiments:
        exp = config["experiments"][name]
        where = f"experiments.{name}"
        method_overrides = exp.get("method_overrides") or {}
        stray = sorted(set(method_overrides) - set(exp["methods"]))
        if stray:
            raise ExperimentError(f"{where}.method_overrides: {stray[0]!r} is not one of its methods {exp['methods']}")
        for position, (method, dataset, point, seed) in enumerate(
            itertools.product(exp["methods"], exp["datasets"], _sweep_points(exp.get("sweep") or {}), exp["seeds"])
        ):
            partial = deep_merge(config["defaults"], _section(config, "datasets", dataset, where))
            method_config = dict(_section(config, "methods", method, where))
            per_dataset = method_config.pop("per_dataset", None) or {}  # the method's values on one dataset
            partial = deep_merge(partial, method_config)
            partial = deep_merge(partial, per_dataset.get(dataset) or {})
            partial = deep_merge(partial, exp.get("overrides") or {})
            partial = deep_merge(
                partial, method_overrides.get(method) or {}
            )  # one method's settings in this experiment
            for path, value in point.items():
                partial = deep_merge(partial, dotted(path, value))
            partial = deep_merge(partial, {"seed": seed})
            try:
                resolved = resolve_run_config(partial)
            except ValueError as error:
                raise ExperimentError(
                    f"{where} (method {method}, dataset {dataset}, seed {seed}, sweep {point}): {error}"
                ) from error
            resolved = without_late_defaults(resolved)  # the train rule's params stay as they were
            yield (
                name,
                position,
                Run(run_id_for(method, dataset, resolved), method, dataset, seed, resolved, {name: point}),
            )


def dataset_parameters(runs: Mapping[str, Run]) -> dict[str, dict[str, Any]]:
    """Dataset name -> its preparation parameters; one prepared copy serves every run of a name."""
    params: dict[str, dict[str, Any]] = {}
    for run in runs.values():
        name, wanted = run.config["dataset"]["name"], canonical(run.config["dataset"]["params"])
        if params.setdefault(name, wanted) != wanted:
            raise ExperimentError(
                f"dataset {name!r} is used with different dataset.params ({params[name]} and "
                f"{wanted}, e.g. in run {run.run_id}); give each variant its own dataset name"
            )
    return params


def experiment_runs(runs: Mapping[str, Run], experiment: str) -> list[Run]:
    """The experiment's runs in its declared order (methods × datasets × sweep × seeds)."""
    return sorted((run for run in runs.values() if experiment in run.experiments), key=lambda r: r.position[experiment])


def validate_workflow_config(config: dict[str, Any], schema: str | Path = SCHEMA) -> None:
    """Check `config` against the workflow's schema and fill in its defaults, as the workflow's
    common.smk does before it resolves the runs."""
    # deferred: snakemake's import costs a tenth of a second, and the workflow has it loaded already
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    if not Path(schema).is_file():
        raise ExperimentError(f"workflow config schema not found: {schema} (give its path with --schema)")
    try:
        validate(config, str(schema))
    except WorkflowError as error:  # its text holds the whole schema: keep the message and the key
        text = str(error)
        message = re.search(r"^ValidationError: (.*)$", text, re.MULTILINE)
        where = re.search(r"^On instance(.*):$", text, re.MULTILINE)
        path = re.findall(r"\[(?:'([^']*)'|(\d+))\]", where.group(1)) if where else []
        key = ".".join(name or index for name, index in path) or "the config"
        raise ExperimentError(
            f"{key}: {message.group(1) if message else text.splitlines()[0]}; expected what {Path(schema).name} allows"
        ) from None


def with_schema_defaults(config: Mapping[str, Any], schema: str | Path = SCHEMA) -> dict[str, Any]:
    """A copy of `config` with every default of the workflow's schema filled in, as snakemake's
    `validate` fills them (the jsonschema FAQ's default-setting validator); the schema is the one place
    of the workflow config's defaults. Filling checks nothing: `validate_workflow_config` does."""
    config = copy.deepcopy(dict(config))
    for _ in _default_filler(str(schema)).iter_errors(config):
        pass  # each visited `properties` keyword fills its defaults; the errors are validate's to report
    return config


@functools.cache
def _default_filler(schema: str):
    from jsonschema import (  # deferred: only the callers that fill defaults
        Draft202012Validator,
        validators,
    )

    def fill(validator, properties, instance, subschema):
        if isinstance(instance, dict):
            for key, spec in properties.items():
                if "default" in spec:
                    instance.setdefault(key, copy.deepcopy(spec["default"]))
        yield from Draft202012Validator.VALIDATORS["properties"](validator, properties, instance, subschema)

    return validators.extend(Draft202012Validator, {"properties": fill})(read_yaml(schema, "workflow config schema"))


def read_workflow_config(path: str | Path) -> dict[str, Any]:
    """The workflow config in the YAML file ``path``; ExperimentError (one line) when the file is
    missing, not YAML or not a mapping."""
    if not Path(path).is_file():
        raise ExperimentError("file not found; expected a workflow config (YAML), e.g. config/config.yaml")
    try:
        config = read_yaml(path, "workflow config")
    except ConfigError as error:
        raise ExperimentError(str(error).removeprefix(str(path)).lstrip(",: ")) from None  # main names the file
    if not isinstance(config, dict):
        raise ExperimentError(
            f"a workflow config is a YAML mapping (datasets, methods, experiments, ...), got {type(config).__name__}"
        )
    return config


def main(argv: list[str] | None = None) -> int:
    """`dmlrepro runs [--configfile FILE ...] [--experiment NAME ...]`: the runs the experiments resolve to."""
    parser = argparse.ArgumentParser(
        prog="dmlrepro runs",
        description="List the runs a workflow config's experiments resolve to: each run id and the experiments "
        "that share it (docs/workflow.md#config).",
    )
    parser.add_argument(
        "--configfile",
        dest="configfiles",
        nargs="+",
        default=["config/config.yaml"],
        metavar="FILE",
        help="workflow config(s); several are merged in order as snakemake --configfile merges them "
        "(default: config/config.yaml)",
    )
    # the former spelling, kept working for scripts; hidden: --configfile is the one spelling of every command
    parser.add_argument("--config", dest="configfiles", nargs="+", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument(
        "--experiment",
        action="append",
        metavar="NAME",
        help="only this experiment (repeatable; default: every active one)",
    )
    parser.add_argument(
        "--schema",
        default=str(SCHEMA),
        help="the workflow's config schema (default: workflow/schemas/config.schema.yaml of this checkout)",
    )
    args = parser.parse_args(argv)
    config: dict[str, Any] = {}
    for path in args.configfiles:
        try:
            config = deep_merge(config, read_workflow_config(path))
        except ExperimentError as error:
            print(f"dmlrepro runs: {path}: {error}")
            return 2
    try:
        validate_workflow_config(config, args.schema)
        runs = resolve_runs(config, args.experiment)
    except ExperimentError as error:
        print(f"dmlrepro runs: {' '.join(args.configfiles)}: {error}")
        return 2
    for run in runs.values():
        shared = ", ".join(f"{name}{' ' + str(point) if point else ''}" for name, point in run.experiments.items())
        print(f"{run.run_id}  {shared}")
    print(f"{len(runs)} runs")
    return 0
