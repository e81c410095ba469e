"""The Snakemake workflow end to end on a tiny config: outputs, the tables and the report against the
runs' own metrics (recomputed here, without dmlrepro.report), no-op rerun, selective reruns."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

# every test here runs snakemake; the module fixture trains the 14 runs once (~1.5 min on 2 cores)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = Path(__file__).with_name("tiny.yaml")
#: metrics the papers print in % (the report shows 100 × the stored fraction); the others as stored
PERCENT = {"recall@1", "recall@2", "recall@1@gaussian_3"}


def snakemake(workdir: Path, config: Path, *args: str, timeout: float = 600) -> str:
    """Snakemake with the Snakefile of the repository's copy (`repository`), its temporary files
    (the job server's folder) in `job_tmpdir`."""
    command = [
        str(SNAKEMAKE),
        "-s",
        str(COPY["repo"] / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(config),
        "--cores",
        "2",
        *args,
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env={**os.environ, "TMPDIR": str(COPY["tmpdir"])}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


COPY: dict[str, Path] = {}  # the module's copy of the repository and its TMPDIR (fixture `repository`)


@pytest.fixture(scope="module", autouse=True)
def repository(tmp_path_factory):
    """A copy of the repository's files (tracked and untracked, not ignored; mtimes kept): the
    workflow runs from it, so a test may change its files' mtimes without touching the repository."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    copy = tmp_path_factory.mktemp("repository")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    COPY.update(repo=copy, tmpdir=tmp_path_factory.mktemp("tmpdir"))
    return copy


def planned_jobs(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> count."""
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", output, re.MULTILINE)
        if m.group(1) != "total"
    }


def planned_runs(output: str) -> set[str]:
    """The run ids of a dry run's train jobs (rule train's message "Training run <id>")."""
    return set(re.findall(r"^Job \d+: Training run (\S+)$", output, re.MULTILINE))


def tiny_config() -> dict:
    return yaml.safe_load(TINY.read_text())


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    snakemake(workdir, TINY, timeout=1500)  # ~1.5 min on 2 idle cores; far longer on a loaded machine
    return workdir


def test_every_experiment_table_is_built(finished):
    with open(finished / "results/experiments/table.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["method"] for row in rows} == {"pfml", "proxy_anchor"}
    assert all(0.0 <= float(row["recall@1_mean"]) <= 1.0 for row in rows)
    with open(finished / "results/experiments/alpha.csv") as handle:
        assert sorted(row["sweep"] for row in csv.DictReader(handle)) == [
            "loss.hparams.alpha=2.0",
            "loss.hparams.alpha=4.0",
        ]
    runs = sorted(p.name for p in (finished / "results/runs").iterdir())
    # 2 seeds each: alpha = 4 is the table's pfml run, alpha = 2, the noisy pfml run, proxy_anchor;
    # RSW: the base run (table, embedding, heatmap k1 = 0.5), heatmap k1 = 1.0, the per-epoch AvgDTP run
    assert len(runs) == 2 * 7
    noise = finished / "data/synthetic/label_noise/rate0.25_seed3_other.csv"
    with open(noise) as handle:
        rows = list(csv.DictReader(handle))
    assert sum(row["label"] != row["noisy_label"] for row in rows) == round(0.25 * len(rows))
    for run in runs:
        assert (finished / "results/runs" / run / "config.yaml").is_file()
        assert (finished / "results/logs/train" / f"{run}.log").is_file()


# -- the tables and the report against the runs -------------------------------------------------


def _dotted(config: dict, path: str):
    for part in path.split("."):
        config = config[part]
    return config


def _measured(run_dir: Path, metric: str) -> float:
    """One run's value of `metric`, from its own files: metrics.json (test metrics, metrics under a
    corruption, proxy metrics) or, for seconds_per_epoch, train_log.csv's `seconds` column averaged
    over the trained epochs (epoch 0 is the untrained evaluation)."""
    if metric == "seconds_per_epoch":
        with open(run_dir / "train_log.csv", newline="") as handle:
            seconds = [float(row["seconds"]) for row in csv.DictReader(handle) if int(row["epoch"]) > 0]
        return math.fsum(seconds) / len(seconds)
    result = json.loads((run_dir / "metrics.json").read_text())
    assert result["status"] == "completed", run_dir
    for block in ("metrics", "corruption_metrics", "proxy_metrics"):
        if metric in (result.get(block) or {}):
            return float(result[block][metric])
    raise KeyError(f"{run_dir.name}: no {metric} in metrics.json")


def expected_cells(workdir: Path, config: dict) -> dict[str, dict]:
    """experiment -> {(method, dataset, sweep label): {"seeds": n, metric: (mean, sample std)}},
    for every experiment with metrics, from its runs' folders alone. Which runs an experiment has
    comes from the run planner (dmlrepro.runs, what Snakemake trains); method, dataset, seed and
    sweep point of each run are read back from the run's own id and resolved config.yaml."""
    from dmlrepro.runs import experiment_runs, resolve_runs

    planned = resolve_runs(config)
    out = {}
    for name, experiment in config["experiments"].items():
        if experiment.get("opt_in") or "search" in experiment or not experiment.get("metrics"):
            continue
        keys = sorted(experiment.get("sweep") or {})
        groups: dict[tuple, list[Path]] = {}
        for run in experiment_runs(planned, name):
            folder = workdir / "results/runs" / run.run_id
            resolved = yaml.safe_load((folder / "config.yaml").read_text())
            label = ", ".join(f"{key}={_dotted(resolved, key)}" for key in keys)
            cell = (run.run_id.split("-")[0], resolved["dataset"]["name"], label)
            groups.setdefault(cell, []).append((resolved["seed"], folder))
        cells = {}
        for cell, members in groups.items():
            assert len({seed for seed, _ in members}) == len(members) >= 2, (name, cell, members)
            values = {m: [_measured(folder, m) for _, folder in members] for m in experiment["metrics"]}
            cells[cell] = {
                "seeds": len(members),
                **{m: (statistics.fmean(v), statistics.stdev(v)) for m, v in values.items()},
            }
        out[name] = cells
    return out


class ReportTables(HTMLParser):
    """section id -> its tables, each a list of rows (the row's class, [(tag, text) per cell]);
    the paper's value printed under ours (span.paper-val) is left out of a cell's text."""

    def __init__(self):
        super().__init__()
        self.sections: dict[str, list] = {}
        self.section = self.row = self.cell = None
        self.hidden = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = self.sections.setdefault(attrs.get("id"), [])
        elif tag == "table" and self.section is not None:
            self.section.append([])
        elif tag == "tr" and self.section:
            self.row = (attrs.get("class"), [])
            self.section[-1].append(self.row)
        elif tag in ("td", "th") and self.row is not None:
            self.cell = [tag, ""]
            self.row[1].append(self.cell)
        elif tag == "span" and (self.hidden or "paper-val" in (attrs.get("class") or "")):
            self.hidden += 1

    def handle_endtag(self, tag):
        if tag == "span" and self.hidden:
            self.hidden -= 1
        elif tag in ("td", "th"):
            self.cell = None
        elif tag == "tr":
            self.row = None
        elif tag == "section":
            self.section = None

    def handle_data(self, data):
        if self.cell is not None and not self.hidden:
            self.cell[1] += data


def _printed(value: float, metric: str) -> set[str]:
    """How the report may print `value` (2 decimals, in the paper's unit): rounded from the value
    itself or from the table's 6 significant digits."""
    scale = 100.0 if metric in PERCENT else 1.0
    return {f"{scale * value:.2f}", f"{scale * float(f'{value:.6g}'):.2f}"}


def test_tables_and_report_show_the_runs_mean_and_sample_std(finished):
    """Every reproduced cell of every experiment table (method × dataset × sweep point, 2 seeds):
    the mean and sample std (n − 1) over seeds of the runs' own metrics, recomputed here, are what
    results/experiments/<experiment>.csv holds (6 significant digits) and what the HTML report's
    "ours" rows print (2 decimals, % for the papers' percentages)."""
    config = tiny_config()
    expected = expected_cells(finished, config)
    assert {"table", "alpha", "timing", "noise", "rsw_table4", "rsw_curves", "rsw_heatmap"} <= set(expected)
    parser = ReportTables()
    parser.feed((finished / "results/report/index.html").read_text())
    checked = 0
    for name, cells in expected.items():
        metrics = config["experiments"][name]["metrics"]
        with open(finished / f"results/experiments/{name}.csv", newline="") as handle:
            rows = {(r["method"], r["dataset"], r["sweep"]): r for r in csv.DictReader(handle)}
        assert set(rows) == set(cells), name
        for cell, want in cells.items():
            row = rows[cell]
            assert row["seeds"] == str(want["seeds"]), (name, cell)
            for metric in metrics:
                mean, std = want[metric]
                assert (row[f"{metric}_mean"], row[f"{metric}_std"]) == (f"{mean:.6g}", f"{std:.6g}"), (
                    name,
                    cell,
                    metric,
                    mean,
                    std,
                )
        # the report: the section's first table; header row 2 names the metric of each column
        table = parser.sections[name][0]
        header = [text.strip() for _, text in table[1][1]]
        assert header == metrics, (name, header)  # one dataset: one column per metric
        printed_names = (config["experiments"][name].get("report") or {}).get("methods") or {}
        ours = {cells_[0][1].strip(): cells_[1 : 1 + len(metrics)] for cls, cells_ in table if cls == "ours"}
        want_labels = {
            printed_names.get(method, method) + (f" ({sweep})" if sweep else ""): (method, dataset, sweep)
            for method, dataset, sweep in cells
        }
        assert set(ours) == set(want_labels), (name, sorted(ours), sorted(want_labels))
        for label, cell in want_labels.items():
            for metric, (_, text) in zip(metrics, ours[label]):
                # the mean ± std, then the cell's gain over the untrained network where the runs recorded it
                shown = re.fullmatch(r"\s*(\S+) ± (\S+)(?:\s*\([+−-]?\S+ over epoch 0\))?\s*", text)
                assert shown, (name, label, metric, text)
                mean, std = cells[cell][metric]
                assert shown.group(1) in _printed(mean, metric), (name, label, metric, text, mean)
                assert shown.group(2) in _printed(std, metric), (name, label, metric, text, std)
                checked += 1
    assert checked >= 14


def test_report_shows_every_experiment(finished):
    html = (finished / "results/report/index.html").read_text()
    for name, experiment in tiny_config()["experiments"].items():
        assert (f'<section id="{name}">' in html) != bool(experiment.get("opt_in")), name  # opt-in: left out
    assert "Potential Field (Ours)" in html and "73.4" in html  # the paper's R@1 beside ours (Table 1, R50, CUB)
    assert "stand-in: synthetic" in html and "Provenance" in html
    images = re.findall(r'<img src="([^"]+)"', html)
    assert len(images) == 9 and all((finished / "results/report" / src).is_file() for src in images)


def test_report_loads_in_chromium(chromium, finished, tmp_path):
    from dmlrepro.report.browser import check_report

    html = (finished / "results/report/index.html").read_text()
    result = check_report(finished / "results/report/index.html", tmp_path / "report.png", width=1400)
    images = len(re.findall(r'<img src="', html))
    assert (result["images"], result["broken"], result["console_errors"], result["overflowing"]) == (images, [], [], [])
    # the summary table opens the page: on the first screen of a 1,400 px window
    assert result["first_table"]["in"] == "<table> in #summary" and result["first_table"]["top"] < result["window"][1]
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_rsw_kinds_corruptions_and_per_epoch_avg_dtp(finished):
    with open(finished / "results/experiments/rsw_table4.csv") as handle:
        (row,) = list(csv.DictReader(handle))
    assert 0.0 <= float(row["recall@1@gaussian_3_mean"]) <= 1.0
    curves = json.loads((finished / "results/sections/rsw_curves/section.json").read_text())
    (figure,) = curves["figures"]
    assert (finished / "results/sections/rsw_curves" / figure["file"]).is_file()
    assert len(curves["runs"]) == 2  # seeds 0 and 1
    for run in curves["runs"]:
        with open(finished / "results/runs" / run / "train_log.csv") as handle:
            log = list(csv.DictReader(handle))
        assert [r["epoch"] for r in log] == ["0", "1", "2"] and all(float(r["avg_dtp"]) > 0 for r in log)
    for name in ("rsw_heatmap", "rsw_landscape", "rsw_embedding"):
        section = json.loads((finished / f"results/sections/{name}/section.json").read_text())
        assert len(section["figures"]) == 1, name
    table = json.loads((finished / "results/sections/rsw_table4/section.json").read_text())["table"]
    ours = [r for r in table["rows"] if r["source"] == "ours"]
    assert [c["paper"] for c in ours[0]["cells"]] == [72.5, 57.7]  # Table IV, Warped Softmax


def test_local_jobs_fork_from_the_job_server(finished):
    # docs/workflow.md#job-server; bit-identity with an in-process run: tests/train/test_served_run.py
    for rule in ("train", "aggregate", "report_section"):
        logs = sorted((finished / "results" / "logs" / rule).glob("*.log"))
        assert logs and all("forked from server" in log.read_text() for log in logs), rule


def test_the_job_server_leaves_no_folder(finished):
    """The workflow's job server lived in a temporary folder (TMPDIR/dmlrepro-jobs-*): gone when the
    workflow ended (docs/workflow.md#job-server)."""
    assert not list(COPY["tmpdir"].glob("dmlrepro-jobs-*"))


def test_rerun_does_nothing(finished):
    assert "Nothing to be done" in snakemake(finished, TINY, "-n")


def test_a_deleted_run_folder_is_retrained_and_its_tables_rebuilt(finished):
    """docs/workflow.md#runs-are-content-addressed: deleting a run's folder reruns that run and what shows
    it (Snakemake alone would rebuild no missing file that only feeds an up-to-date table), from `all`
    and from a target; the folder is moved back afterwards."""
    run_id = "proxy_anchor-synthetic-tiny_cnn-s1-"  # in the experiments `table` and `timing`
    (folder,) = (path for path in (finished / "results/runs").iterdir() if path.name.startswith(run_id))
    aside = finished / "aside"
    folder.rename(aside)
    try:
        output = snakemake(finished, TINY, "-n")
        assert planned_runs(output) == {folder.name}
        plan = {"train": 1, "aggregate": 2, "report_section": 2, "report": 1, "all": 1}
        assert planned_jobs(output) == plan
        target = snakemake(finished, TINY, "-n", "table")
        assert planned_runs(target) == {folder.name} and planned_jobs(target)["target_report"] == 1
    finally:
        aside.rename(folder)
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


def test_new_file_times_of_a_fresh_clone_rerun_nothing(finished, repository):
    """A clone or checkout gives the workflow's scripts, templates and reported CSVs new mtimes;
    profiles/default drops Snakemake's script-mtime `code` trigger, so nothing reruns. (The mtimes
    change in the module's copy of the repository, which the workflow runs from.)"""
    later = time.time()  # newer than every output, not in the future (Snakemake refuses clock skew)
    touched = [
        path
        for folder in ("workflow", "reports", "config/reported")
        for path in (repository / folder).rglob("*")
        if path.is_file()
    ] + [repository / "Snakefile"]
    for path in touched:
        os.utime(path, (later, later))
    assert "Nothing to be done" in snakemake(finished, TINY, "-n")


# -- a change replans exactly the runs it touches ---------------------------------------------------


def _set(path: str, value):
    def change(config):
        *parents, last = path.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return change


# change, which runs it touches (a predicate on dmlrepro.runs.Run), searches replanned, other jobs
CHANGES = {
    # one method's loss hyperparameter: its 2 runs (table and timing share them)
    "method hyperparameter": (
        _set("methods.proxy_anchor.loss.hparams", {"margin": 0.2}),
        lambda run: run.method == "proxy_anchor",
        2,
        0,
        {"aggregate": 2, "report_section": 2, "report": 1, "all": 1},
    ),
    # a `defaults` key: every run that does not set it itself (RSW's method sets embedding_size: 2),
    # and the search, whose base run inherits it
    "defaults key": (
        _set("defaults.model.embedding_size", 24),
        lambda run: run.method in ("pfml", "proxy_anchor"),
        8,
        1,
        None,
    ),
    # a dataset's run-config parameter (not a preparation parameter): every run on it, no new data
    "dataset parameter": (_set("datasets.synthetic.dataset.hflip", 0.0), lambda run: True, 14, 1, None),
    # one sweep point (alpha 2 -> 3; alpha = 4 is also the table's run): that point's 2 seeds only
    "sweep point": (
        _set("experiments.alpha.sweep", {"loss.hparams.alpha": [3.0, 4.0]}),
        lambda run: run.experiments.get("alpha") == {"loss.hparams.alpha": 3.0},
        2,
        0,
        {"aggregate": 1, "report_section": 1, "report": 1, "all": 1},
    ),
}


@pytest.mark.parametrize("kind", list(CHANGES))
def test_a_change_replans_exactly_the_runs_it_touches(finished, tmp_path, kind):
    from dmlrepro.runs import resolve_runs

    change, touched, count, searches, others = CHANGES[kind]
    config = tiny_config()
    change(config)
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(config))
    output = snakemake(finished, path, "-n")
    plan = planned_jobs(output)
    expected = {run_id for run_id, run in resolve_runs(config).items() if touched(run)}
    assert len(expected) == count
    assert planned_runs(output) == expected, sorted(planned_runs(output) ^ expected)
    done = {p.name for p in (finished / "results/runs").iterdir()}
    assert not expected & done  # new run ids: no finished run is trained again under its old id
    assert plan.get("search", 0) == searches and "prepare_dataset" not in plan and "label_noise" not in plan
    if others is not None:
        assert {k: v for k, v in plan.items() if k != "train"} == others


def test_final_stage_trains_each_searchs_best_point_in_one_call(finished, tmp_path):
    """The opt-in `reality` experiment (RSW App. D in miniature), on a copy of the finished workflow:
    one call runs the per-method searches, then (checkpoints) their best points as 2 seeds × 2 fold
    runs, the Complete runs' epochs, the Complete runs, and the MLRC table with its three blocks;
    a second call has nothing to do."""
    workdir = tmp_path / "workflow"
    shutil.copytree(finished, workdir, symlinks=True)
    opt_in = ("--config", "opt_in=[reality]")
    before = {p.name for p in (workdir / "results/runs").iterdir()}
    snakemake(workdir, TINY, *opt_in, "--", "results/report/index.html", timeout=1500)
    new = {p.name for p in (workdir / "results/runs").iterdir()} - before
    assert len(new) == 2 * 2 * (2 + 1)  # methods × seeds × (folds + Complete)
    for search in (workdir / "results/search").glob("*"):
        if search.name.startswith(("pfml-synthetic-tiny_cnn-s0", "proxy_anchor")) and (search / "best.json").is_file():
            best = json.loads((search / "best.json").read_text())["params"]
            method = search.name.split("-")[0]
            assert set(best) == {
                "optimizer.lr",
                {"pfml": "loss.hparams.alpha", "proxy_anchor": "loss.hparams.margin"}[method],
            }
    configs = [yaml.safe_load((workdir / "results/runs" / run / "config.yaml").read_text()) for run in new]
    assert sorted(c["model"]["embedding_size"] for c in configs) == [16] * 8 + [32] * 4  # 4 Complete runs
    (epochs,) = {json.loads(p.read_text())["epochs"] for p in (workdir / "results/final/reality").glob("*/epochs.json")}
    assert epochs == 2 and all(c["epochs"] == 2 for c in configs)  # the fold runs' 2 epochs, rounded to 1
    with open(workdir / "results/experiments/reality.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(row["method"] for row in rows) == ["pfml", "proxy_anchor"]
    for row in rows:
        assert row["seeds"] == "2" and row["diverged"] == "0"
        for block in ("separated", "concatenated", "complete"):
            assert 0.0 < float(row[f"map@r@{block}_mean"]) <= 1.0 and float(row[f"map@r@{block}_ci95"]) >= 0.0
    assert '<section id="reality">' in (workdir / "results/report/index.html").read_text()
    assert "Nothing to be done" in snakemake(workdir, TINY, *opt_in, "-n")
    assert not (finished / "results/experiments/reality.csv").exists()  # the shared fixture is untouched


# the one lint the workflow keeps on purpose: no rule names a conda env or container, because nothing here
# could test one (docs/preflight.md#conda)
NO_DEPLOYMENT_LINT = "Specify a conda environment or container for each rule."


def test_lint_and_format():
    lint = subprocess.run(
        [str(SNAKEMAKE), "--lint", "-s", str(REPO / "Snakefile")], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    output = lint.stdout + lint.stderr
    lints = {line.strip()[2:].rstrip(":") for line in output.splitlines() if line.lstrip().startswith("* ")}
    assert lints <= {NO_DEPLOYMENT_LINT}, output
    assert lint.returncode == 0 or lints, output
    snakefmt = shutil.which("snakefmt", path=str(SNAKEMAKE.parent))
    fmt = subprocess.run([snakefmt, "--check", "Snakefile", "workflow"], cwd=REPO, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stderr


def test_bad_config_is_rejected_before_any_job(tmp_path):
    config = tiny_config()
    config["experiments"]["table"]["seeds"] = [-1]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    command = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--configfile",
        str(bad),
        "--cores",
        "1",
        "-n",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "seeds" in done.stdout + done.stderr
