"""config/real_data.yaml, the real-data set on the genuine MNIST / Fashion-MNIST: valid, and its
recipes are config/paper.yaml's key for key (every run paper.yaml also has keeps its run id), with
3 seeds wherever an experiment compares two methods."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dmlrepro.report.sections import check_report
from dmlrepro.runs import main as runs_main, resolve_runs

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "config" / "real_data.yaml"
# config/paper.yaml's experiments on MNIST / Fashion-MNIST: ASAP Sec. 5.2, Figs. 1/6 and RSW Fig. 10
PAPER_EXPERIMENTS = ["asap_fig1_mnist_poc", "asap_mnist_samples", "rsw_fig10_toy"]


@pytest.fixture(scope="module")
def real():
    return yaml.safe_load(REAL.read_text())


def test_valid_and_resolves(real, capsys):
    assert runs_main(["--config", str(REAL)]) == 0  # the workflow's schema, then every run resolved
    assert capsys.readouterr().out.rstrip().endswith("\n11 runs")
    for name, experiment in real["experiments"].items():
        check_report(name, experiment)


def test_the_papers_runs_keep_their_ids(real):
    paper = resolve_runs(yaml.safe_load((ROOT / "config" / "paper.yaml").read_text()), PAPER_EXPERIMENTS)
    ours = resolve_runs(real, list(real["experiments"]))
    assert len(paper) == 4 and set(paper) <= set(ours)
    assert {r.dataset for r in ours.values()} == {"mnist", "fashion_mnist"}


def test_comparisons_have_three_seeds(real):
    for name, experiment in real["experiments"].items():
        if len(experiment["methods"]) > 1 and experiment["report"].get("kind") != "embedding_2d":
            assert experiment["seeds"] == [0, 1, 2], name
    loss_proxy = resolve_runs(real, ["real_mnist_fig4a"])
    asap = {r.seed: r.config for r in loss_proxy.values() if r.method == "c2_asap_mnist"}
    for run in loss_proxy.values():  # Loss-Proxy: the ASAP run with one projection and λ = 0, else equal
        if run.method == "c2_proxy_mnist":
            other = asap[run.seed]
            assert run.config["asap"] == {**other["asap"], "lam": 0.0, "alternate": False}
            assert {k: v for k, v in run.config.items() if k != "asap"} == {
                k: v for k, v in other.items() if k != "asap"
            }
