"""The report's 2-d figure (kind embedding_2d, RSW Fig. 10) draws the proxies a run exported when
training ended (final_proxies.npz), equal to the final checkpoint's, without reading checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlrepro.report.aggregate import aggregate_runs
from dmlrepro.report.sections import build_section
from dmlrepro.train.state import RunDir

REPORTED = "config/reported"
PNG = b"\x89PNG\r\n\x1a\n"
SYNTH = {"num_classes": 8, "images_per_class": 6, "size": 32}  # 4 training classes, 4 test classes


def _run_config(root) -> dict:
    """A 2-d RSW run of a few seconds (RSW's Euclidean space, no normalisation)."""
    return {
        "dataset": {
            "name": "synthetic",
            "root": str(root),
            "params": SYNTH,
            "image_size": 32,
            "resize": 32,
            "batch_size": 16,
            "eval_batch_size": 64,
        },
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [8, 8], "strides": [2, 2]},
            "embedding_size": 2,
            "l2_normalize": False,
        },
        "loss": {"name": "rsw", "hparams": {"alpha": 2.0, "k1": 0.5, "k2": 1.5}},
        "eval": {"distance": "euclidean"},
        "epochs": 1,
        "steps_per_epoch": 2,
        "seed": 0,
        "threads": 1,
    }


@pytest.fixture(scope="module")
def run_2d(tmp_path_factory):
    from dmlrepro.train import resolve_run_config, train_run

    root = tmp_path_factory.mktemp("data")
    out = tmp_path_factory.mktemp("runs") / "rsw-2d"
    assert train_run(_run_config(root), out, progress=False)["status"] == "completed"
    return {
        "run_id": "rsw-2d",
        "method": "rsw",
        "dataset": "synthetic",
        "seed": 0,
        "config": resolve_run_config(_run_config(root)),
        "dir": str(out),
    }


@pytest.mark.slow
def test_a_run_exports_its_final_proxies_and_their_classes(run_2d):
    from dmlrepro.train import list_checkpoints, read_checkpoint

    with np.load(RunDir(run_2d["dir"]).final_proxies) as saved:
        proxies, labels = saved["proxies"], saved["labels"]
    final = read_checkpoint(list_checkpoints(RunDir(run_2d["dir"]).checkpoints)[-1])
    assert torch.equal(torch.from_numpy(proxies), final["loss"]["proxies"])
    assert labels.tolist() == [0, 1, 2, 3]  # RSW: one proxy per training class (synthetic: the first half)


@pytest.mark.slow
def test_the_embedding_2d_section_draws_the_exported_proxies(run_2d, tmp_path, monkeypatch):
    from dmlrepro.report import figures

    drawn = []
    monkeypatch.setattr(
        figures,
        "embedding_2d_figure",
        lambda panels, path, _f=figures.embedding_2d_figure: drawn.extend(panels) or _f(panels, path),
    )
    section = build_section(
        "emb",
        {"methods": ["rsw"], "datasets": ["synthetic"], "metrics": [], "report": {"kind": "embedding_2d"}},
        aggregate_runs([], []),
        [run_2d],
        tmp_path,
        reported_dir=REPORTED,
        method_configs={},
    )
    assert (tmp_path / section["figures"][0]["file"]).read_bytes()[:8] == PNG
    with np.load(RunDir(run_2d["dir"]).final_proxies) as saved:
        assert np.array_equal(drawn[0]["proxies"], saved["proxies"])
        assert np.array_equal(drawn[0]["proxy_labels"], saved["labels"])


@pytest.mark.slow
def test_a_run_finished_before_the_export_gets_it_by_training_again_without_its_metrics(run_2d, tmp_path):
    """The way out the section names: without metrics.json the run finishes again from its final
    checkpoint (no epoch trained), which writes the file."""
    import shutil

    from dmlrepro.train import train_run

    old = RunDir(shutil.copytree(run_2d["dir"], tmp_path / "old"))
    expected = old.final_proxies.read_bytes()
    old.final_proxies.unlink()
    old.metrics.unlink()
    train_run(run_2d["config"], old.root, progress=False)
    assert old.final_proxies.read_bytes() == expected


def test_a_loss_without_proxies_exports_none(tmp_path):
    from dmlrepro.losses import build_loss
    from dmlrepro.train.outputs import write_final_proxies

    rundir = RunDir(tmp_path)
    write_final_proxies(rundir, build_loss("contrastive", num_classes=3, embedding_size=2), np.array([4, 7, 9]))
    assert not rundir.final_proxies.exists()
    write_final_proxies(
        rundir, build_loss("pfml", num_classes=3, embedding_size=2, proxies_per_class=2), np.array([4, 7, 9])
    )
    with np.load(rundir.final_proxies) as saved:
        assert saved["proxies"].shape == (6, 2) and saved["labels"].tolist() == [4, 4, 7, 7, 9, 9]


def test_a_run_folder_without_the_file_is_refused_with_the_way_out(tmp_path):
    from dmlrepro.evaluation import save_embeddings
    from dmlrepro.report.section_data import embedding_panel

    save_embeddings(RunDir(tmp_path).embeddings(), np.zeros((4, 2)), np.arange(4))
    run = {"run_id": "old", "method": "rsw", "dir": str(tmp_path)}
    with pytest.raises(ValueError, match=r"no final_proxies\.npz .*delete its metrics\.json"):
        embedding_panel(run, {})
