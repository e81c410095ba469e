"""The kinds of report section (config `experiments.<name>.report.kind`; docs/report.md): a
registry name -> builder, as losses and backbones are. A builder draws its figures into the
section's folder and fills its part of `section.json`; report.sections writes what every kind
shares (title, notes, the paper-vs-reproduced table of the tabular kinds).

kinds
  table      paper-shaped table: reported vs reproduced, Δ, within-uncertainty (compare.py)
  sweep      metric vs the swept key, one panel per dataset (PFML Fig. 3), and the table
  timing     seconds per training epoch and the ratio to an anchor method (PFML supp. Table 6)
  hparams    the resolved run config beside a reported hyperparameter table (PFML supp. Table 5)
  retrieval  queries and their nearest test neighbours, green/red framed (PFML supp. Fig. 1)
  tsne       t-SNE of a run's test embeddings (PFML supp. Fig. 2)
  toy_field  the 2-D class fields of the method's loss, no training (PFML main Fig. 2)
  curves     a per-epoch train_log.csv column against the epoch, one line per run (RSW Fig. 9), and the table
  heatmap    a metric over the grid of two swept keys (RSW Fig. 7), and the table
  landscape  the analytic RSW loss over the plane for each method's warping function, no runs (RSW Fig. 3/5)
  embedding_2d  a 2-d run's test embeddings and its final proxies (RSW Fig. 10)
  proxy_geometry  ASAP Fig. 1 measured: each run's proxy spread (collapse) and covering radius, the
             covering radius per projection, and 2-d figures (report.proxy_geometry)
  projection_steps  histogram of ASAP's steps per projection from the runs' validation logs (ASAP Fig. 4b)
  projections  validation geometry at each ASAP projection's solution: t-SNE, MAP@R, covering radius,
             inter-class distance (ASAP Fig. 7; runs with asap.save_val_embeddings)
  search_surface  a Bayesian search's GP posterior over two searched keys with its trials, and the
             best point beside the paper's choice (ASAP Fig. 2; experiments with `search:`)
  improvement  a metric per method and its improvement over the method's base loss (report.base),
             absolute and in %, as bars grouped by base loss, one panel per dataset, and the table
             (ASAP Fig. 5, ASAP-R22)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlrepro.train.state import RunDir

from . import figures
from .reported import paper_units
from .section_data import (
    check_improvement,
    embedding_panel,
    epoch_ratios,
    first_runs_per_dataset,
    first_runs_per_method,
    hparam_rows,
    improvement_rows,
    projection_panels,
    projection_steps,
    retrieval_queries,
    run_curves,
)


@dataclass
class SectionInputs:
    """What a kind's builder reads (an experiment's config, aggregated table, runs, searches) and
    the section it fills (`section`: the content of section.json, `outdir`: its folder)."""

    name: str
    experiment: Mapping[str, Any]
    aggregated: pd.DataFrame
    runs: Sequence[Mapping]
    searches: Sequence[Mapping]
    reported: pd.DataFrame | None
    method_configs: Mapping
    outdir: Path
    section: dict

    @property
    def spec(self) -> Mapping[str, Any]:
        return self.experiment.get("report") or {}

    @property
    def methods(self) -> Mapping[str, str]:
        return self.spec.get("methods") or {}

    @property
    def datasets(self) -> Mapping[str, str]:
        return self.spec.get("datasets") or {}

    @property
    def metrics(self) -> list[str]:
        return list(self.experiment.get("metrics") or [])

    @property
    def seeds(self) -> int:
        """Expected reproductions: a search's final stage trains final.seeds (RSW App. D), others their seeds."""
        return len((self.experiment.get("final") or {}).get("seeds") or self.experiment.get("seeds", [0]))

    def label(self, method: str) -> str:
        return self.methods.get(method, method)

    def figure(self, file: str, caption: str) -> Path:
        """List figure `file` with its caption in the section; returns where to draw it."""
        self.section["figures"].append({"file": file, "caption": caption})
        return self.outdir / file


@dataclass(frozen=True)
class Kind:
    """A section kind: `build` draws and fills the section; `table`: the section shows the
    paper-vs-reproduced table; `check(name, experiment)`: fails on a bad report spec before anything
    is drawn (the workflow also calls it at parse time)."""

    build: Callable[[SectionInputs], None]
    table: bool = False
    check: Callable[[str, Mapping], Any] | None = None


SECTION_KINDS: dict[str, Kind] = {}


def register_kind(name: str, *, table: bool = False, check: Callable[[str, Mapping], Any] | None = None):
    """Decorator: the builder of section kind `name`."""

    def add(build: Callable[[SectionInputs], None]) -> Callable[[SectionInputs], None]:
        SECTION_KINDS[name] = Kind(build, table, check)
        return build

    return add


def section_kind(name: str, kind: str) -> Kind:
    """The registered kind `kind` of experiment `name`'s report; a ValueError names the known ones."""
    if kind not in SECTION_KINDS:
        raise ValueError(f"experiments.{name}.report.kind: {kind!r} is not one of {tuple(SECTION_KINDS)}")
    return SECTION_KINDS[kind]


def _file(*parts: str, metric: str | None = None) -> str:
    """A figure's file name: the parts joined by "_", then the metric with "@" spelt "_at_"."""
    return "_".join([*parts, *([metric.replace("@", "_at_")] if metric else [])]) + ".png"


@register_kind("table", table=True)
def table_section(inputs: SectionInputs) -> None:
    """The table only (report.sections draws it)."""


@register_kind("sweep", table=True)
def sweep_section(inputs: SectionInputs) -> None:
    spec = inputs.spec
    x_label = spec.get("x_label", spec["x"])
    for metric in spec.get("plot_metrics", inputs.metrics[:1]):
        path = inputs.figure(
            _file(inputs.name, metric=metric), f"{metric} vs {x_label}, mean ± std over {inputs.seeds} seed(s)"
        )
        figures.sweep_figure(
            inputs.aggregated,
            spec["x"],
            metric,
            path,
            x_label=spec.get("x_label"),
            datasets=inputs.datasets,
            x_offset=float(spec.get("x_offset", 0.0)),
        )


@register_kind("timing", table=True)
def timing_section(inputs: SectionInputs) -> None:
    inputs.section["ratios"] = epoch_ratios(inputs.aggregated, inputs.spec.get("anchor"), inputs.methods)


@register_kind("hparams")
def hparams_section(inputs: SectionInputs) -> None:
    inputs.section["hparams"] = hparam_rows(
        inputs.runs, inputs.reported, inputs.spec.get("keys") or {}, inputs.methods, inputs.datasets
    )


@register_kind("retrieval")
def retrieval_section(inputs: SectionInputs) -> None:
    count, k = int(inputs.spec.get("queries", 2)), int(inputs.spec.get("neighbours", 4))
    for run in first_runs_per_dataset(inputs.runs):
        path = inputs.figure(
            _file(inputs.name, run["dataset"]),
            f"{inputs.datasets.get(run['dataset'], run['dataset'])}: "
            f"queries (black) and their nearest test neighbours, green = same class, "
            f"red = other (run {run['run_id']})",
        )
        figures.retrieval_grid(retrieval_queries(run, count, k), path, title=run["run_id"])


@register_kind("tsne")
def tsne_section(inputs: SectionInputs) -> None:
    # torch (dmlrepro.evaluation): deferred, so that dmlrepro.report imports without it
    from dmlrepro.evaluation.embeddings_io import load_embeddings

    for run in first_runs_per_dataset(inputs.runs):
        found = load_embeddings(RunDir(run["dir"]).embeddings())
        path = inputs.figure(_file(inputs.name, run["dataset"]), f"t-SNE of the test embeddings of {run['run_id']}")
        figures.tsne_figure(
            found.embeddings, found.labels, path, seed=int(inputs.spec.get("seed", 0)), title=f"t-SNE, {run['run_id']}"
        )


@register_kind("toy_field")
def toy_field_section(inputs: SectionInputs) -> None:
    # torch (the loss modules): deferred, so that dmlrepro.report imports without it
    from dmlrepro.losses import build_loss

    from .landscapes import toy_configuration, toy_fields

    for method in inputs.experiment["methods"]:
        loss_cfg = inputs.method_configs[method]["loss"]
        toy = toy_configuration(int(inputs.spec.get("seed", 0)))
        loss = build_loss(
            loss_cfg["name"],
            num_classes=2,
            embedding_size=2,
            **{**(loss_cfg.get("hparams") or {}), "proxies_per_class": 2},
        )
        path = inputs.figure(
            _file(inputs.name, method),
            f"class fields Ψ₁, Ψ₂ of {method} ({loss.extra_repr()}) with the net force −∇Ψ (arrows, direction only)",
        )
        figures.toy_field_figure(toy_fields(loss, *toy), path)


@register_kind("curves", table=True)
def curves_section(inputs: SectionInputs) -> None:
    column = inputs.spec.get("column", "test_recall@1")
    y_label = inputs.spec.get("y_label", column)
    path = inputs.figure(
        _file(inputs.name, metric=column),
        f"{y_label} (train_log.csv column {column}) per epoch, mean "
        f"over seeds; × = the last finite epoch of a diverged run",
    )
    figures.curves_figure(run_curves(inputs.runs, column, inputs.methods), path, y_label=y_label)


@register_kind("heatmap", table=True)
def heatmap_section(inputs: SectionInputs) -> None:
    spec = inputs.spec
    metric = (spec.get("plot_metrics") or inputs.metrics)[0]
    for (method, dataset), rows in inputs.aggregated.groupby(["method", "dataset"], sort=False):
        path = inputs.figure(
            _file(inputs.name, method, dataset, metric=metric),
            f"{metric} (mean over {inputs.seeds} "
            f"seed(s)) over {spec.get('x_label', spec['x'])} × {spec.get('y_label', spec['y'])}",
        )
        figures.heatmap_figure(
            rows,
            spec["x"],
            spec["y"],
            metric,
            path,
            x_label=spec.get("x_label"),
            y_label=spec.get("y_label"),
            title=f"{inputs.label(method)}, {inputs.datasets.get(dataset, dataset)}",
        )


@register_kind("landscape")
def landscape_section(inputs: SectionInputs) -> None:
    # torch (the loss modules): deferred, so that dmlrepro.report imports without it
    from .landscapes import landscape_panels

    spec, methods = inputs.spec, inputs.experiment["methods"]
    for m in methods:
        if inputs.method_configs[m]["loss"]["name"] != "rsw":
            raise ValueError(
                f"experiments.{inputs.name}.report.kind landscape: method {m!r} has loss "
                f"{inputs.method_configs[m]['loss']['name']!r}, expected rsw"
            )
    panels = [
        {
            "title": inputs.label(m),
            "hparams": dict(inputs.method_configs[m]["loss"].get("hparams") or {}),
            "delta": spec.get("delta", "value"),
        }
        for m in methods
    ]
    proxies = np.asarray(spec.get("proxies", [[0.0, 0.0], [2.0, 0.0]]), dtype=float)
    path = inputs.figure(
        _file(inputs.name),
        f"per-sample loss of eq. 8 over the plane, {len(proxies)} fixed "
        f"proxies (gold: ground truth), s = {spec.get('scale', 1.0)}, Δ read as "
        f"{spec.get('delta', 'value')!r}; red +: the grid's minimum",
    )
    drawn = landscape_panels(
        panels, proxies, extent=spec.get("extent", (-6.0, 4.0, -5.0, 5.0)), scale=float(spec.get("scale", 1.0))
    )
    figures.landscape_figure(drawn, proxies, path)


@register_kind("embedding_2d")
def embedding_2d_section(inputs: SectionInputs) -> None:
    path = inputs.figure(
        _file(inputs.name),
        "test-split embeddings (2-d, coloured by class) and the final "
        "proxies (stars; grey: a class with no embedding shown)",
    )
    figures.embedding_2d_figure(
        [embedding_panel(run, inputs.methods) for run in first_runs_per_method(inputs.runs)], path
    )


@register_kind("proxy_geometry")
def proxy_geometry_section(inputs: SectionInputs) -> None:
    """ASAP Fig. 1 measured (report.proxy_geometry): every run's proxy spread and covering radius, the
    covering radius per projection, and the lowest seed's 2-d embeddings with the proxies."""
    from .proxy_geometry import final_panel, method_summary, projection_panels_2d, radius_curve, run_geometry

    measured = [run_geometry(run) for run in inputs.runs]
    if not measured:
        return
    inputs.section["proxy_geometry"] = method_summary(measured, inputs.methods)
    inputs.section["proxy_geometry_runs"] = [{k: v for k, v in r.items() if k != "drawn"} for r in measured]
    lowest = {run["run_id"] for run in first_runs_per_method(inputs.runs)}
    firsts = [r for r in measured if r["run_id"] in lowest]
    path = inputs.figure(
        _file(inputs.name, "proxies"),
        f"test embeddings and the final proxies (stars) in the "
        f"evaluated space (eval.normalize: {firsts[0]['normalize']}), each method's lowest seed",
    )
    figures.embedding_2d_figure([final_panel(r, inputs.label(r["method"])) for r in firsts], path)
    for r in firsts:
        path = inputs.figure(
            _file(inputs.name, r["method"], "projections"),
            f"{inputs.label(r['method'])} (run "
            f"{r['run_id']}): the validation embeddings at each projection's solution θ*",
        )
        figures.embedding_2d_figure(projection_panels_2d(r), path)
    path = inputs.figure(
        _file(inputs.name, "radius"),
        "average covering radius of the validation embeddings (App. A.3.1) at each projection's solution θ*, every run",
    )
    figures.projection_radius_figure([radius_curve(r, inputs.label(r["method"])) for r in measured], path)


@register_kind("projection_steps")
def projection_steps_section(inputs: SectionInputs) -> None:
    steps = projection_steps(inputs.runs)
    path = inputs.figure(
        _file(inputs.name),
        f"steps per projection, {len(steps)} projections of "
        f"{len(inputs.runs)} run(s) (closed by an alternation or early stopping)",
    )
    figures.histogram_figure(
        [s["steps"] for s in steps],
        path,
        x_label="steps per projection",
        unit=min((s["steps_per_evaluation"] for s in steps), default=None),
    )
    inputs.section["projections"] = steps


@register_kind("projections")
def projections_section(inputs: SectionInputs) -> None:
    for run in first_runs_per_method(inputs.runs):
        panels, rows = projection_panels(run)
        path = inputs.figure(
            _file(inputs.name, run["method"]),
            f"t-SNE of the validation embeddings at each "
            f"projection's solution θ*, {inputs.label(run['method'])} (run {run['run_id']}); "
            f"radius and distances in the embedding space",
        )
        figures.projection_geometry_figure(panels, path, seed=int(inputs.spec.get("seed", 0)))
        inputs.section["geometry"] = inputs.section.get("geometry", []) + rows


@register_kind("search_surface")
def search_surface_section(inputs: SectionInputs) -> None:
    """One GP-posterior figure per search (report.x, report.y: two searched keys) and its best point
    beside the paper's choice (report.paper_best: searched key -> reported metric name)."""
    # torch (dmlrepro.tuning runs the training engine): deferred, so that dmlrepro.report imports without it
    from dmlrepro.tuning import load_trials, posterior_surface

    spec, space = inputs.spec, inputs.experiment["search"]["space"]
    x, y = spec["x"], spec["y"]
    paper = {} if inputs.reported is None else {r.metric: r.value_text for r in inputs.reported.itertuples()}
    rows = []
    for found in inputs.searches:
        trials = load_trials(found["dir"])
        label = f"{inputs.label(found['method'])}, {inputs.datasets.get(found['dataset'], found['dataset'])}"
        complete = trials[trials["state"] == "COMPLETE"]
        if len(complete) >= 2:
            surface = posterior_surface(
                complete, x, y, log_x=bool(spec.get("log_x")), log_y=bool(spec.get("log_y")), space=space
            )
            path = inputs.figure(
                _file(inputs.name, found["method"], found["dataset"]),
                f"{label}: GP posterior mean "
                f"of the validation objective over {spec.get('x_label', x)} × "
                f"{spec.get('y_label', y)}, {len(complete)} trials (search {found['run_id']})",
            )
            figures.search_surface_figure(
                surface, path, x_label=spec.get("x_label", x), y_label=spec.get("y_label", y), title=label
            )
        best = complete.loc[complete["value"].idxmax()] if len(complete) else None
        for key in space:
            metric = (spec.get("paper_best") or {}).get(key)
            rows.append(
                {
                    "run": found["run_id"],
                    "hyperparameter": key,
                    "key": key,
                    "paper": paper.get(metric) if metric else None,
                    "ours": "–" if best is None else f"{best[key]:g}",
                }
            )
        if best is not None:
            rows.append(
                {
                    "run": found["run_id"],
                    "hyperparameter": "validation objective (best trial)",
                    "key": "value",
                    "paper": None,
                    "ours": f"{best['value']:.4g} ({len(complete)} trials)",
                }
            )
    inputs.section["hparams"] = rows


@register_kind("improvement", table=True, check=check_improvement)
def improvement_section(inputs: SectionInputs) -> None:
    metric, bases = check_improvement(inputs.name, inputs.experiment)
    rows = improvement_rows(inputs.aggregated, metric, bases, inputs.experiment["methods"], inputs.methods)
    inputs.section["improvements"] = rows
    unit = " (%)" if paper_units(metric, 1.0) == 100.0 else ""
    path = inputs.figure(
        _file(inputs.name, metric=metric),
        f"{metric}{unit} per method (mean over {inputs.seeds} seed(s)), "
        f"grouped by base loss (grey); labels: Δ over the base loss, absolute and in % of the base "
        f"(ASAP-R22)",
    )
    figures.improvement_figure(rows, path, y_label=metric + unit, datasets=inputs.datasets)
