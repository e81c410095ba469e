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
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlrepro.atomic import write_json_atomic

from . import figures
from .compare import comparison_table
from .reported import load_reported

KINDS = ("table", "sweep", "timing", "hparams", "retrieval", "tsne", "toy_field")
SECTION_FILE = "section.json"


def build_section(name: str, experiment: Mapping[str, Any], aggregated: pd.DataFrame, runs: Sequence[Mapping],
                  outdir: str | os.PathLike, *, reported_dir: str | os.PathLike, method_configs: Mapping) -> dict:
    """Write `outdir/section.json` (and its figures) for experiment `name`; return the section.

    `runs`: the experiment's runs in declared order, each with `run_id`, `method`, `dataset`, `seed`,
    `config` (resolved) and `dir` (the run folder). `method_configs`: config.methods, for the toy."""
    spec = experiment.get("report") or {}
    kind = spec.get("kind", "table")
    if kind not in KINDS:
        raise ValueError(f"experiments.{name}.report.kind: {kind!r} is not one of {KINDS}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    reported = None
    if spec.get("reported"):
        reported = load_reported(Path(reported_dir) / f"{spec['reported']}.csv", spec.get("block"))
    section = {"experiment": name, "kind": kind, "title": spec.get("title", name),
               "description": experiment.get("description", ""), "paper_says": spec.get("paper_says", ""),
               "reported": spec.get("reported"), "block": spec.get("block"), "table": None, "figures": [],
               "notes": list(spec.get("notes", [])), "ratios": [], "hparams": [],
               "runs": [r["run_id"] for r in runs]}
    methods, datasets = spec.get("methods") or {}, spec.get("datasets") or {}
    seeds = len(experiment.get("seeds", [0]))
    metrics = list(experiment.get("metrics") or [])
    if kind in ("table", "sweep", "timing"):
        section["table"] = comparison_table(aggregated, reported, metrics, methods, datasets, seeds)
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
    write_json_atomic(outdir / SECTION_FILE, section)
    return section


def _first_runs_per_dataset(runs: Sequence[Mapping]) -> list[Mapping]:
    """The experiment's first run on each dataset (its first method, lowest seed)."""
    first: dict[str, Mapping] = {}
    for run in runs:
        if run["dataset"] not in first or run["seed"] < first[run["dataset"]]["seed"]:
            first.setdefault(run["dataset"], run)
    return list(first.values())


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
