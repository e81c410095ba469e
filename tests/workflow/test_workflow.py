"""The Snakemake workflow end to end on a tiny config: outputs, no-op rerun, selective rerun."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = Path(__file__).with_name("tiny.yaml")


def snakemake(workdir: Path, config: Path, *args: str) -> str:
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
               "--configfile", str(config), "--cores", "2", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def planned_jobs(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> count."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", output, re.MULTILINE)
            if m.group(1) != "total"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    snakemake(workdir, TINY)
    return workdir


def test_every_experiment_table_is_built(finished):
    with open(finished / "results/experiments/table.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["method"] for row in rows} == {"pfml", "proxy_anchor"}
    assert all(0.0 <= float(row["recall@1_mean"]) <= 1.0 for row in rows)
    with open(finished / "results/experiments/alpha.csv") as handle:
        assert sorted(row["sweep"] for row in csv.DictReader(handle)) == ["loss.hparams.alpha=2.0",
                                                                         "loss.hparams.alpha=4.0"]
    runs = sorted(p.name for p in (finished / "results/runs").iterdir())
    # alpha = 4 is the table's pfml run; the noisy pfml run is a run of its own; RSW: the base run
    # (table, embedding, heatmap k1 = 0.5), heatmap k1 = 1.0, and the per-epoch AvgDTP run
    assert len(runs) == 7
    noise = finished / "data/synthetic/label_noise/rate0.25_seed3_other.csv"
    with open(noise) as handle:
        rows = list(csv.DictReader(handle))
    assert sum(row["label"] != row["noisy_label"] for row in rows) == round(0.25 * len(rows))
    for run in runs:
        assert (finished / "results/runs" / run / "config.yaml").is_file()
        assert (finished / "results/logs/train" / f"{run}.log").is_file()


def test_report_shows_every_experiment_and_loads_in_chromium(finished, tmp_path):
    from dmlrepro.report.browser import check_report, find_chromium

    html = (finished / "results/report/index.html").read_text()
    for name, experiment in yaml.safe_load(TINY.read_text())["experiments"].items():
        assert (f'<section id="{name}">' in html) != bool(experiment.get("opt_in")), name   # opt-in: left out
    assert "Potential Field (Ours)" in html and "73.4" in html  # the paper's R@1 beside ours (Table 1, R50, CUB)
    assert "stand-in: synthetic" in html and "Provenance" in html
    images = re.findall(r'<img src="([^"]+)"', html)
    assert len(images) == 9 and all((finished / "results/report" / src).is_file() for src in images)
    if find_chromium() is None:
        pytest.skip("chromium is not installed (.ci/run installs it): the browser check did not run")
    result = check_report(finished / "results/report/index.html", tmp_path / "report.png")
    assert result == {"images": 9, "broken": [], "console_errors": []}
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_rsw_kinds_corruptions_and_per_epoch_avg_dtp(finished):
    import json

    with open(finished / "results/experiments/rsw_table4.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert 0.0 <= float(row["recall@1@gaussian_3_mean"]) <= 1.0
    curves = json.loads((finished / "results/report/sections/rsw_curves/section.json").read_text())
    (figure,) = curves["figures"]
    assert (finished / "results/report/sections/rsw_curves" / figure["file"]).is_file()
    (run,) = curves["runs"]
    with open(finished / "results/runs" / run / "train_log.csv") as handle:
        log = list(csv.DictReader(handle))
    assert [r["epoch"] for r in log] == ["0", "1", "2"] and all(float(r["avg_dtp"]) > 0 for r in log)
    for name in ("rsw_heatmap", "rsw_landscape", "rsw_embedding"):
        section = json.loads((finished / f"results/report/sections/{name}/section.json").read_text())
        assert len(section["figures"]) == 1, name
    table = json.loads((finished / "results/report/sections/rsw_table4/section.json").read_text())["table"]
    ours = [r for r in table["rows"] if r["source"] == "ours"]
    assert [c["paper"] for c in ours[0]["cells"]] == [72.5, 57.7]  # Table IV, Warped Softmax


def test_rerun_does_nothing(finished):
    assert "Nothing to be done" in snakemake(finished, TINY, "-n")


def test_search_experiment_and_opt_in(finished):
    """The search ran its 3 trials (no workflow run of its own); choosing the opt-in experiment plans its
    one run, its table and section, and the report."""
    (folder,) = (finished / "results/search").iterdir()
    with open(folder / "trials.csv") as handle:
        trials = list(csv.DictReader(handle))
    assert [t["state"] for t in trials] == ["COMPLETE"] * 3 and (folder / "best.json").is_file()
    assert not any(p.name.startswith(folder.name) for p in (finished / "results/runs").iterdir())
    plan = planned_jobs(snakemake(finished, TINY, "-n", "--config", "opt_in=[costly]"))
    assert plan == {"train": 1, "aggregate": 1, "report_section": 1, "report": 1, "all": 1}


def test_new_file_times_of_a_fresh_clone_rerun_nothing(finished):
    """A clone or checkout gives the workflow's scripts, templates and reported CSVs new mtimes;
    profiles/default drops Snakemake's script-mtime `code` trigger, so nothing reruns."""
    later = time.time()  # newer than every output, not in the future (Snakemake refuses clock skew)
    for folder in ("workflow", "reports", "config/reported"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file():
                os.utime(path, (later, later))
    os.utime(REPO / "Snakefile", (later, later))
    assert "Nothing to be done" in snakemake(finished, TINY, "-n")


def test_changed_hyperparameter_reruns_only_the_runs_it_touches(finished, tmp_path):
    config = yaml.safe_load(TINY.read_text())
    config["methods"]["proxy_anchor"]["loss"]["hparams"] = {"margin": 0.2}
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(config))
    plan = planned_jobs(snakemake(finished, changed, "-n"))
    # the one proxy_anchor run, the two experiments that show it (table, timing), their report
    # sections and the report; no data preparation, no other run
    assert plan == {"train": 1, "aggregate": 2, "report_section": 2, "report": 1, "all": 1}



def test_final_stage_trains_each_searchs_best_point_in_one_call(finished):
    """The opt-in `reality` experiment (RSW App. D in miniature): one call runs the per-method searches,
    then (checkpoints) their best points as 2 seeds × 2 fold runs, the Complete runs' epochs, the
    Complete runs, and the MLRC table with its three blocks; a second call has nothing to do."""
    import json

    opt_in = ("--config", "opt_in=[reality]")
    before = {p.name for p in (finished / "results/runs").iterdir()}
    snakemake(finished, TINY, *opt_in, "--", "results/report/index.html")
    new = {p.name for p in (finished / "results/runs").iterdir()} - before
    assert len(new) == 2 * 2 * (2 + 1)  # methods × seeds × (folds + Complete)
    for search in (finished / "results/search").glob("*"):
        if search.name.startswith(("pfml-synthetic-tiny_cnn-s0", "proxy_anchor")) and (search / "best.json").is_file():
            best = json.loads((search / "best.json").read_text())["params"]
            method = search.name.split("-")[0]
            assert set(best) == {"optimizer.lr", {"pfml": "loss.hparams.alpha",
                                                  "proxy_anchor": "loss.hparams.margin"}[method]}
    configs = [yaml.safe_load((finished / "results/runs" / run / "config.yaml").read_text()) for run in new]
    assert sorted(c["model"]["embedding_size"] for c in configs) == [16] * 8 + [32] * 4  # 4 Complete runs
    (epochs,) = {json.loads(p.read_text())["epochs"] for p in (finished / "results/final/reality").glob("*/epochs.json")}
    assert epochs == 2 and all(c["epochs"] == 2 for c in configs)  # the fold runs' 2 epochs, rounded to 1
    with open(finished / "results/experiments/reality.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(row["method"] for row in rows) == ["pfml", "proxy_anchor"]
    for row in rows:
        assert row["seeds"] == "2" and row["diverged"] == "0"
        for block in ("separated", "concatenated", "complete"):
            assert 0.0 < float(row[f"map@r@{block}_mean"]) <= 1.0 and float(row[f"map@r@{block}_ci95"]) >= 0.0
    assert '<section id="reality">' in (finished / "results/report/index.html").read_text()
    assert "Nothing to be done" in snakemake(finished, TINY, *opt_in, "-n")


def test_lint_and_format():
    lint = subprocess.run([str(SNAKEMAKE), "--lint", "-s", str(REPO / "Snakefile")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0 and "Congratulations" in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    snakefmt = shutil.which("snakefmt", path=str(SNAKEMAKE.parent))
    fmt = subprocess.run([snakefmt, "--check", "Snakefile", "workflow/rules"], cwd=REPO, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stderr


def test_bad_config_is_rejected_before_any_job(tmp_path):
    config = yaml.safe_load(TINY.read_text())
    config["experiments"]["table"]["seeds"] = [-1]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    command = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(bad),
               "--cores", "1", "-n"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "seeds" in done.stdout + done.stderr
