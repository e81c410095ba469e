"""One report section per experiment: its kind (config `experiments.<name>.report.kind`) decides
what is drawn. Every section is plain data (`section.json`) plus its figures, in one folder.

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

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlrepro.atomic import write_json_atomic

from . import figures
from .aggregate import sweep_label
from .compare import comparison_table
from .reported import load_reported, paper_units

KINDS = ("table", "sweep", "timing", "hparams", "retrieval", "tsne", "toy_field", "curves", "heatmap", "landscape",
         "embedding_2d", "projection_steps", "projections", "search_surface", "improvement")
SECTION_FILE = "section.json"


def build_section(name: str, experiment: Mapping[str, Any], aggregated: pd.DataFrame, runs: Sequence[Mapping],
                  outdir: str | os.PathLike, *, reported_dir: str | os.PathLike, method_configs: Mapping,
                  searches: Sequence[Mapping] = ()) -> dict:
    """Write `outdir/section.json` (and its figures) for experiment `name`; return the section.

    `runs`: the experiment's runs in declared order, each with `run_id`, `method`, `dataset`, `seed`,
    `config` (resolved) and `dir` (the run folder). `method_configs`: config.methods, for the toy.
    `searches`: an experiment with `search:` has searches instead of runs (`run_id`, `method`,
    `dataset`, `seed`, `dir` = the search folder of dmlrepro.tuning)."""
    spec = experiment.get("report") or {}
    kind = spec.get("kind", "table")
    if kind not in KINDS:
        raise ValueError(f"experiments.{name}.report.kind: {kind!r} is not one of {KINDS}")
    if kind == "improvement":
        improvement_metric, bases = check_improvement(name, experiment)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    reported = None
    if spec.get("reported"):
        reported = load_reported(Path(reported_dir) / f"{spec['reported']}.csv", spec.get("block"))
        if spec.get("block_metrics"):
            reported = blocks_as_metrics(reported, spec["block_metrics"], list((spec.get("datasets") or {}).values()))
    section = {"experiment": name, "kind": kind, "title": spec.get("title", name),
               "description": experiment.get("description", ""), "paper_says": spec.get("paper_says", ""),
               "reported": spec.get("reported"), "block": spec.get("block"), "table": None, "figures": [],
               "notes": list(spec.get("notes", [])), "readings": list(spec.get("readings", [])),
               "ratios": [], "hparams": [],
               "runs": [r["run_id"] for r in runs]}
    methods, datasets = spec.get("methods") or {}, spec.get("datasets") or {}
    # expected reproductions: a search's final stage trains final.seeds (RSW App. D), others their seeds
    seeds = len((experiment.get("final") or {}).get("seeds") or experiment.get("seeds", [0]))
    metrics = list(experiment.get("metrics") or [])
    if kind in ("table", "sweep", "timing", "curves", "heatmap", "improvement"):
        section["table"] = comparison_table(aggregated, reported, metrics, methods, datasets, seeds,
                                            spec.get("uncertainty", "ci95" if spec.get("mlrc") else "std"))
    if kind == "sweep":
        for metric in spec.get("plot_metrics", metrics[:1]):
            file = f"{name}_{metric.replace('@', '_at_')}.png"
            figures.sweep_figure(aggregated, spec["x"], metric, outdir / file, x_label=spec.get("x_label"),
                                 datasets=datasets, x_offset=float(spec.get("x_offset", 0.0)))
            section["figures"].append({"file": file, "caption": f"{metric} vs {spec.get('x_label', spec['x'])}, "
                                       f"mean ± std over {seeds} seed(s)"})
    elif kind == "timing":
        section["ratios"] = _ratios(aggregated, spec.get("anchor"), methods)
    elif kind == "hparams":
        section["hparams"] = _hparams(runs, reported, spec.get("keys") or {}, methods, datasets)
    elif kind == "retrieval":
        for run in _first_runs_per_dataset(runs):
            file = f"{name}_{run['dataset']}.png"
            figures.retrieval_grid(_queries(run, int(spec.get("queries", 2)), int(spec.get("neighbours", 4))),
                                   outdir / file, title=run["run_id"])
            section["figures"].append({"file": file, "caption": f"{datasets.get(run['dataset'], run['dataset'])}: "
                                       f"queries (black) and their nearest test neighbours, green = same class, "
                                       f"red = other (run {run['run_id']})"})
    elif kind == "tsne":
        from dmlrepro.evaluation.embeddings_io import load_embeddings

        for run in _first_runs_per_dataset(runs):
            found = load_embeddings(Path(run["dir"]) / "embeddings_test.npz")
            file = f"{name}_{run['dataset']}.png"
            figures.tsne_figure(found.embeddings, found.labels, outdir / file, seed=int(spec.get("seed", 0)),
                                title=f"t-SNE, {run['run_id']}")
            section["figures"].append({"file": file, "caption": f"t-SNE of the test embeddings of {run['run_id']}"})
    elif kind == "toy_field":
        from dmlrepro.losses import build_loss

        for method in experiment["methods"]:
            loss_cfg = method_configs[method]["loss"]
            points, labels, proxies, proxy_labels = figures.toy_configuration(int(spec.get("seed", 0)))
            loss = build_loss(loss_cfg["name"], num_classes=2, embedding_size=2,
                              **{**(loss_cfg.get("hparams") or {}), "proxies_per_class": 2})
            file = f"{name}_{method}.png"
            figures.toy_field_figure(loss, points, labels, proxies, proxy_labels, outdir / file)
            section["figures"].append({"file": file, "caption": f"class fields Ψ₁, Ψ₂ of {method} "
                                       f"({loss.extra_repr()}) with the net force −∇Ψ (arrows, direction only)"})
    elif kind == "curves":
        column = spec.get("column", "test_recall@1")
        file = f"{name}_{column.replace('@', '_at_')}.png"
        figures.curves_figure(run_curves(runs, column, methods), outdir / file, y_label=spec.get("y_label", column))
        section["figures"].append({"file": file, "caption": f"{spec.get('y_label', column)} (train_log.csv column "
                                   f"{column}) per epoch, mean over seeds; × = the last finite epoch of a diverged run"})
    elif kind == "heatmap":
        metric = (spec.get("plot_metrics") or metrics)[0]
        for (method, dataset), rows in aggregated.groupby(["method", "dataset"], sort=False):
            file = f"{name}_{method}_{dataset}_{metric.replace('@', '_at_')}.png"
            figures.heatmap_figure(rows, spec["x"], spec["y"], metric, outdir / file, x_label=spec.get("x_label"),
                                   y_label=spec.get("y_label"), title=f"{methods.get(method, method)}, "
                                   f"{datasets.get(dataset, dataset)}")
            section["figures"].append({"file": file, "caption": f"{metric} (mean over {seeds} seed(s)) over "
                                       f"{spec.get('x_label', spec['x'])} × {spec.get('y_label', spec['y'])}"})
    elif kind == "landscape":
        panels = [{"title": methods.get(m, m), "hparams": dict(method_configs[m]["loss"].get("hparams") or {}),
                   "delta": spec.get("delta", "value")} for m in experiment["methods"]]
        for m in experiment["methods"]:
            if method_configs[m]["loss"]["name"] != "rsw":
                raise ValueError(f"experiments.{name}.report.kind landscape: method {m!r} has loss "
                                 f"{method_configs[m]['loss']['name']!r}, expected rsw")
        file = f"{name}.png"
        proxies = spec.get("proxies", [[0.0, 0.0], [2.0, 0.0]])
        figures.landscape_figure(panels, np.asarray(proxies, dtype=float), outdir / file,
                                 extent=spec.get("extent", (-6.0, 4.0, -5.0, 5.0)), scale=float(spec.get("scale", 1.0)))
        section["figures"].append({"file": file, "caption": f"per-sample loss of eq. 8 over the plane, {len(proxies)} "
                                   f"fixed proxies (gold: ground truth), s = {spec.get('scale', 1.0)}, Δ read as "
                                   f"{spec.get('delta', 'value')!r}; red +: the grid's minimum"})
    elif kind == "embedding_2d":
        file = f"{name}.png"
        figures.embedding_2d_figure([embedding_panel(run, methods) for run in _first_runs_per_method(runs)],
                                    outdir / file)
        section["figures"].append({"file": file, "caption": "test-split embeddings (2-d, coloured by class) and the "
                                   "final proxies (stars; grey: a class with no embedding shown)"})
    elif kind == "projection_steps":
        steps = projection_steps(runs)
        file = f"{name}.png"
        figures.histogram_figure([s["steps"] for s in steps], outdir / file, x_label="steps per projection",
                                 unit=min((s["steps_per_evaluation"] for s in steps), default=None))
        section["figures"].append({"file": file, "caption": f"steps per projection, {len(steps)} projections "
                                   f"of {len(runs)} run(s) (closed by an alternation or early stopping)"})
        section["projections"] = steps
    elif kind == "projections":
        for run in _first_runs_per_method(runs):
            panels, rows = projection_panels(run)
            file = f"{name}_{run['method']}.png"
            figures.projection_geometry_figure(panels, outdir / file, seed=int(spec.get("seed", 0)))
            section["figures"].append({"file": file, "caption": f"t-SNE of the validation embeddings at each "
                                       f"projection's solution θ*, {methods.get(run['method'], run['method'])} "
                                       f"(run {run['run_id']}); radius and distances in the embedding space"})
            section["geometry"] = section.get("geometry", []) + rows
    elif kind == "search_surface":
        section["hparams"] = _search_surfaces(name, experiment, searches, outdir, section, reported, methods, datasets)
    elif kind == "improvement":
        rows = improvement_rows(aggregated, improvement_metric, bases, experiment["methods"], methods)
        section["improvements"] = rows
        file = f"{name}_{improvement_metric.replace('@', '_at_')}.png"
        unit = " (%)" if paper_units(improvement_metric, 1.0) == 100.0 else ""
        figures.improvement_figure(rows, outdir / file, y_label=improvement_metric + unit, datasets=datasets)
        section["figures"].append({"file": file, "caption": f"{improvement_metric}{unit} per method (mean over "
                                   f"{seeds} seed(s)), grouped by base loss (grey); labels: Δ over the base loss, "
                                   f"absolute and in % of the base (ASAP-R22)"})
    write_json_atomic(outdir / SECTION_FILE, section)
    return section


def check_improvement(name: str, experiment: Mapping) -> tuple[str, dict[str, str]]:
    """(metric, base) of an `improvement` report: `report.metric` (default: the first of `metrics`) must
    be one of the experiment's metrics, and `report.base` maps variants to their base loss, both among
    the experiment's methods; a ValueError names the key otherwise."""
    spec, declared = experiment.get("report") or {}, list(experiment.get("methods") or [])
    metrics = list(experiment.get("metrics") or [])
    metric = spec.get("metric", metrics[0] if metrics else None)
    if metric not in metrics:
        raise ValueError(f"experiments.{name}.report.metric = {metric!r}: expected one of the experiment's "
                         f"metrics {metrics}")
    base = spec.get("base")
    if not isinstance(base, Mapping) or not base:
        raise ValueError(f"experiments.{name}.report.base = {base!r}: expected a mapping variant method -> "
                         f"its base-loss method")
    for variant, parent in base.items():
        if variant not in declared:
            raise ValueError(f"experiments.{name}.report.base: {variant!r} is not one of the experiment's "
                             f"methods {declared}")
        if parent not in declared:
            raise ValueError(f"experiments.{name}.report.base.{variant} = {parent!r}: the base method is not "
                             f"one of the experiment's methods {declared}")
        if parent == variant:
            raise ValueError(f"experiments.{name}.report.base.{variant}: a method is not its own base")
    return metric, dict(base)


def improvement_rows(aggregated: pd.DataFrame, metric: str, base: Mapping[str, str], declared: Sequence[str],
                     methods: Mapping[str, str]) -> list[dict]:
    """ASAP Fig. 5 (ASAP-R22): per (dataset, sweep point) and method, `metric` (mean over seeds, paper units)
    and, for a variant in `base`, its improvement over its base loss on the same dataset and sweep
    point: `delta` = variant − base (paper units), `delta_pct` = 100 · delta / base (None when the base
    is missing or 0). Rows come grouped by base loss: each base (declared order of its first variant's
    base) then its variants in declared order; methods in no pair last, each alone."""
    order, groups = [], {}
    for method in declared:
        parent = base.get(method)
        if parent is not None:
            groups.setdefault(parent, [])
            if parent not in order:
                order.append(parent)
            groups[parent].append(method)
    drawn = set(order) | {m for ms in groups.values() for m in ms}
    layout = [row for parent in order for row in [(parent, parent, "base"),
                                                   *((parent, m, "variant") for m in groups[parent])]]
    layout += [(m, m, "alone") for m in declared if m not in drawn]
    frame = aggregated.assign(sweep=aggregated["sweep"].astype(object).where(aggregated["sweep"].notna(), "")) \
        if len(aggregated) else aggregated
    values: dict[tuple, float | None] = {}
    points = []
    for record in frame.to_dict("records"):
        point = (record["dataset"], record["sweep"])
        if point not in points:
            points.append(point)
        value = record.get(f"{metric}_mean")
        value = None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)
        values[(record["method"], *point)] = None if value is None else paper_units(metric, value)
    out = []
    for dataset, sweep in points:
        for group, method, role in layout:
            present = [method, *(groups[method] if role == "base" else [])]
            if not any((m, dataset, sweep) in values for m in present):
                continue
            value = values.get((method, dataset, sweep))
            base_value = values.get((group, dataset, sweep)) if role == "variant" else None
            delta = None if value is None or base_value is None else value - base_value
            pct = None if delta is None or base_value == 0 else 100.0 * delta / base_value
            out.append({"dataset": dataset, "sweep": sweep, "method": method, "label": methods.get(method, method),
                        "group": group, "role": role, "base": group if role == "variant" else None,
                        "base_label": methods.get(group, group) if role == "variant" else None,
                        "metric": metric, "value": value, "base_value": base_value, "delta": delta,
                        "delta_pct": pct})
    return out


def _search_surfaces(name: str, experiment: Mapping, searches: Sequence[Mapping], outdir: Path, section: dict,
                     reported: pd.DataFrame | None, methods: Mapping, datasets: Mapping) -> list[dict]:
    """One GP-posterior figure per search (report.x, report.y: two searched keys) and its best point
    beside the paper's choice (report.paper_best: searched key -> reported metric name)."""
    from dmlrepro.tuning import load_trials, posterior_surface

    spec, search = experiment["report"], experiment["search"]
    x, y = spec["x"], spec["y"]
    paper = {} if reported is None else {r.metric: r.value_text for r in reported.itertuples()}
    rows = []
    for found in searches:
        trials = load_trials(found["dir"])
        label = f"{methods.get(found['method'], found['method'])}, {datasets.get(found['dataset'], found['dataset'])}"
        complete = trials[trials["state"] == "COMPLETE"]
        if len(complete) >= 2:
            surface = posterior_surface(complete, x, y, log_x=bool(spec.get("log_x")), log_y=bool(spec.get("log_y")),
                                        space=search["space"])
            file = f"{name}_{found['method']}_{found['dataset']}.png"
            figures.search_surface_figure(surface, outdir / file, x_label=spec.get("x_label", x),
                                          y_label=spec.get("y_label", y), title=label)
            section["figures"].append({"file": file, "caption": f"{label}: GP posterior mean of the validation "
                                       f"objective over {spec.get('x_label', x)} × {spec.get('y_label', y)}, "
                                       f"{len(complete)} trials (search {found['run_id']})"})
        best = complete.loc[complete["value"].idxmax()] if len(complete) else None
        for key in search["space"]:
            metric = (spec.get("paper_best") or {}).get(key)
            rows.append({"run": found["run_id"], "hyperparameter": key, "key": key,
                         "paper": paper.get(metric) if metric else None,
                         "ours": "–" if best is None else f"{best[key]:g}"})
        if best is not None:
            rows.append({"run": found["run_id"], "hyperparameter": "validation objective (best trial)",
                         "key": "value", "paper": None, "ours": f"{best['value']:.4g} ({len(complete)} trials)"})
    return rows


def projection_steps(runs: Sequence[Mapping]) -> list[dict]:
    """Every closed projection of the runs' validation_log.json (ASAP Fig. 4b)."""
    import json

    out = []
    for run in runs:
        path = Path(run["dir"]) / "validation_log.json"
        if not path.is_file():
            raise ValueError(f"report kind projection_steps: run {run['run_id']} has no validation_log.json "
                             f"(not a run with a validation split)")
        log = json.loads(path.read_text())
        for p in log["projections"]:
            out.append({"run_id": run["run_id"], "projection": p["projection"], "steps": p["steps"],
                        "end_reason": p["end_reason"], "steps_per_evaluation": log["steps_per_evaluation"]})
    return out


def projection_panels(run: Mapping) -> tuple[list[dict], list[dict]]:
    """Fig. 7 panels of one run: each saved projections/projection-K_val.npz with its MAP@R (leave-one-out
    on the validation classes), average covering radius and mean inter-class distance."""
    from dmlrepro.evaluation import retrieval_metrics
    from dmlrepro.evaluation.embeddings_io import load_embeddings
    from dmlrepro.evaluation.geometry import average_covering_radius, mean_interclass_distance
    from dmlrepro.evaluation.knn import l2_normalize

    files = sorted((Path(run["dir"]) / "projections").glob("projection-*_val.npz"),
                   key=lambda p: int(p.stem.split("-")[1].split("_")[0]))
    if not files:
        raise ValueError(f"report kind projections: run {run['run_id']} saved no validation embeddings "
                         f"(set asap.save_val_embeddings: true)")
    panels, rows = [], []
    for path in files:
        found = load_embeddings(path)
        k = int(found.meta.get("projection", len(rows)))
        unit = l2_normalize(found.embeddings)
        row = {"run_id": run["run_id"], "projection": k,
               "map@r": retrieval_metrics(unit, found.labels, ks=(1,), distance="euclidean")["map@r"],
               "covering_radius": average_covering_radius(unit, found.labels),
               "interclass_distance": mean_interclass_distance(unit, found.labels)}
        rows.append(row)
        title = "single proxy-DML (projection 0)" if k == 0 else f"after alternation {k}"
        panels.append({"title": title, "embeddings": found.embeddings, "labels": found.labels,
                       "annotation": f"MAP@R {row['map@r']:.3f}\nradius {row['covering_radius']:.3f}\n"
                                     f"inter-class {row['interclass_distance']:.3f}"})
    return panels, rows


def blocks_as_metrics(reported: pd.DataFrame, block_metrics: Mapping[str, str], printed_datasets: Sequence[str]):
    """Reported rows of a printed block as a metric of ours: `block_metrics` maps our metric (e.g.
    `recall@1@gaussian_3`) to the printed block (`Additive Noise: Gaussian`); the printed metric is
    the one our name starts with (`recall@1`). Rows that print no dataset (RSW Table IV) are read
    as `printed_datasets` (the report's dataset mapping). Rows of other blocks are dropped."""
    out = []
    for ours, block in block_metrics.items():
        rows = reported[reported["block"] == block]
        if rows.empty:
            raise ValueError(f"report.block_metrics: no reported rows in block {block!r}")
        rows = rows[[ours == m or ours.startswith(m + "@") for m in rows["metric"]]].assign(metric=ours)
        if rows.empty:
            raise ValueError(f"report.block_metrics: {ours!r} matches no printed metric of block {block!r}")
        for printed in printed_datasets or [""]:
            out.append(rows.assign(dataset=rows["dataset"].where(rows["dataset"] != "", printed)))
    return pd.concat(out, ignore_index=True)


def run_curves(runs: Sequence[Mapping], column: str, methods: Mapping[str, str]) -> list[dict]:
    """Per (method, dataset, sweep point): the mean over seeds of train_log.csv `column` at each epoch
    where it was logged (an epoch missing in some seed's log, e.g. after a divergence, averages the rest)."""
    from .compare import row_label

    groups: dict[tuple, list] = {}
    for run in runs:
        log = pd.read_csv(Path(run["dir"]) / "train_log.csv")
        if column not in log:
            raise ValueError(f"{run['dir']}/train_log.csv has no column {column!r} (columns: {list(log.columns)}); "
                             f"per-epoch proxy metrics need eval.proxy_metrics_per_epoch and eval.every > 0")
        label = row_label(methods.get(run["method"], run["method"]), sweep_label(run.get("sweep") or {}))
        groups.setdefault((label, run["dataset"]), []).append(log)
    datasets = {d for _, d in groups}
    out = []
    for (label, dataset), logs in groups.items():
        merged = pd.concat([log[["epoch", column]].dropna() for log in logs])
        mean = merged.groupby("epoch")[column].mean()
        diverged = any(log["loss"].isna().iloc[-1] and log["epoch"].iloc[-1] > 0 for log in logs)
        out.append({"label": label if len(datasets) == 1 else f"{label}, {dataset}",
                    "epoch": mean.index.to_numpy(), "value": mean.to_numpy(), "diverged": diverged})
    return out


def _lowest_seed_runs(runs: Sequence[Mapping], key) -> list[Mapping]:
    """The lowest-seed run of each group `key(run)` (the first such run on a tie), groups in declared order."""
    chosen: dict[Any, Mapping] = {}
    for run in runs:
        group = key(run)
        if group not in chosen or run["seed"] < chosen[group]["seed"]:
            chosen[group] = run
    return list(chosen.values())


def _first_runs_per_method(runs: Sequence[Mapping]) -> list[Mapping]:
    """The lowest-seed run of each (method, dataset), in declared order."""
    return _lowest_seed_runs(runs, lambda run: (run["method"], run["dataset"]))


def embedding_panel(run: Mapping, methods: Mapping[str, str]) -> dict:
    """A 2-d run's test embeddings and its final proxies (from the newest checkpoint), each proxy
    labelled with its training class (row c = the c-th smallest training label, as the engine maps them)."""
    from dmlrepro.data.manifest import read_manifest
    from dmlrepro.evaluation.embeddings_io import load_embeddings
    from dmlrepro.train.checkpoint import load_latest
    from dmlrepro.train.data import validation_rows

    found = load_embeddings(Path(run["dir"]) / "embeddings_test.npz")
    latest = load_latest(Path(run["dir"]) / "checkpoints")
    if latest is None or "proxies" not in latest[0]["loss"]:
        raise ValueError(f"{run['dir']}: no checkpoint with the loss's proxies (loss.proxies) to draw")
    proxies = latest[0]["loss"]["proxies"].detach().cpu().numpy()
    dataset = run["config"]["dataset"]
    manifest = read_manifest(Path(dataset["root"]) / dataset["name"])
    split = validation_rows(run["config"].get("validation"), manifest)  # ASAP: the fold's training classes
    classes = np.unique(manifest.classes(dataset["train_split"]) if split is None else manifest.labels[split[0]])
    per_class = max(len(proxies) // len(classes), 1)  # rows c·P + k belong to class c (ASAP, P proxies each)
    return {"title": f"{methods.get(run['method'], run['method'])} ({run['run_id']})", "embeddings": found.embeddings,
            "labels": found.labels, "proxies": proxies, "proxy_labels": np.repeat(classes, per_class)[:len(proxies)]}


def _first_runs_per_dataset(runs: Sequence[Mapping]) -> list[Mapping]:
    """The experiment's first method's lowest-seed run on each dataset."""
    first_method = [run for run in runs if run["method"] == runs[0]["method"]] if runs else []
    return _lowest_seed_runs(first_method, lambda run: run["dataset"])


def _queries(run: Mapping, count: int, k: int) -> list[dict]:
    """`count` seeded queries of the run's test embeddings with their k nearest neighbours."""
    from dmlrepro.data.manifest import read_manifest
    from dmlrepro.evaluation.embeddings_io import load_embeddings
    from dmlrepro.evaluation.knn import knn_search

    found = load_embeddings(Path(run["dir"]) / "embeddings_test.npz")
    dataset = run["config"]["dataset"]
    manifest = read_manifest(Path(dataset["root"]) / dataset["name"])
    picks = np.random.default_rng(run["seed"]).choice(len(found.labels), size=count, replace=False)
    _, neighbours = knn_search(found.embeddings[picks], k, found.embeddings)
    out = []
    for q, row in zip(picks, neighbours):
        row = [int(i) for i in row if int(i) != int(q)][:k]  # the query itself is not its own neighbour
        out.append({"image": manifest.abspath(int(found.indices[q])), "label": int(found.labels[q]),
                    "neighbours": [(manifest.abspath(int(found.indices[i])), int(found.labels[i])) for i in row]})
    return out


def _ratios(aggregated: pd.DataFrame, anchor: str | None, methods: Mapping[str, str]) -> list[dict]:
    """Seconds per epoch of every row over the anchor method's, per dataset (PFML supp. §5)."""
    if not anchor or "seconds_per_epoch_mean" not in aggregated:
        return []
    out = []
    for dataset, rows in aggregated.groupby("dataset", sort=False):
        base = rows.loc[rows["method"] == anchor, "seconds_per_epoch_mean"]
        if base.empty:
            raise ValueError(f"timing: anchor method {anchor!r} has no run on {dataset}")
        for row in rows.itertuples():
            out.append({"dataset": dataset, "label": methods.get(row.method, row.method),
                        "anchor": methods.get(anchor, anchor), "ratio": row.seconds_per_epoch_mean / base.iloc[0]})
    return out


def _hparams(runs: Sequence[Mapping], reported: pd.DataFrame | None, keys: Mapping[str, str],
             methods: Mapping[str, str], datasets: Mapping[str, str]) -> list[dict]:
    """Rows (hyperparameter, reported value per printed column, our resolved value) for each run:
    `keys` maps the reported `metric` name to our dotted run-config key."""
    from dmlrepro.runs import dotted_get

    out = []
    for run in runs:
        printed_dataset = datasets.get(run["dataset"], run["dataset"])
        for metric, key in keys.items():
            paper = None
            if reported is not None:
                hit = reported[(reported["metric"] == metric) & (reported["dataset"] == printed_dataset) &
                               (reported["method"] == methods.get(run["method"], run["method"]))]
                paper = "; ".join(f"{v} ({b})" if b else str(v) for v, b in zip(hit["value_text"], hit["backbone"])) or None
            out.append({"run": run["run_id"], "hyperparameter": metric, "key": key, "paper": paper,
                        "ours": dotted_get(run["config"], key)})
    return out
