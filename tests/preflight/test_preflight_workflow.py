"""The preflight job's requests: each the largest of the training jobs' it stands in for."""

from pathlib import Path

import pytest
import yaml

from dmlrepro.preflight.workflow import preflight_resources, trained_datasets

ROOT = Path(__file__).resolve().parents[2]


def _config(train_requests: dict, experiments: dict) -> dict:
    return {"experiments": experiments, "resources": {"train": train_requests}}


def test_each_request_is_the_largest_of_the_trained_datasets():
    """A long small job and a short large one: the preflight holds both (every shape it steps fits)."""
    config = _config(
        {
            "default": {"gpu": 1, "cpus": 8},
            "sop": {"runtime": 480, "mem_mb": 64000, "cpus": 16},
            "mnist": {"runtime": 600, "mem_mb": 16000, "warning": 120},
        },
        {"table": {"datasets": ["cub200", "sop"]}, "toy": {"datasets": ["mnist"]}},
    )
    assert preflight_resources(config, ["table", "toy"]) == {
        "runtime": 600,
        "mem_mb": 64000,
        "gpu": 1,
        "cpus": 16,
        "warning": 120,
    }


def test_only_the_named_experiments_count():
    config = _config(
        {"sop": {"runtime": 480, "mem_mb": 64000}},
        {"table": {"datasets": ["cub200", "sop"]}, "toy": {"datasets": ["mnist", "cub200"]}},
    )
    assert trained_datasets(config, ["toy"]) == ["mnist", "cub200"]
    assert preflight_resources(config, ["toy"]) == {"runtime": 60, "mem_mb": 4000, "gpu": 0, "cpus": 1}


def test_no_trained_dataset_is_refused():
    with pytest.raises(ValueError, match="nothing to preflight"):
        preflight_resources(_config({}, {"report_only": {}}), ["report_only"])


def test_the_paper_configs_preflight_holds_a_sop_training_job():
    """docs/preflight.md: in config/paper.yaml the preflight job asks what a SOP training job asks, though
    MNIST and Fashion-MNIST (60,000 training images) have more training images than SOP (59,551)."""
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    sop = config["resources"]["train"]["sop"]
    request = preflight_resources(config, list(config["experiments"]))
    assert all(request[key] >= value for key, value in sop.items())
    assert request["mem_mb"] == 64000 and request["runtime"] == 480
