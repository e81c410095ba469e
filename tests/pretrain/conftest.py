"""The stand-in's tests read the embedded default with its tables on `synthetic`, fine-tuning the stand-in
(standin_dataset.yaml), the toys on `digits` from scratch, as the default ran them before it moved to
`double_digits` and the digit-pretrained trunk."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def standin_config() -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    synthetic = yaml.safe_load(Path(__file__).with_name("standin_dataset.yaml").read_text())
    config["datasets"] = {**synthetic, "digits": config["datasets"]["digits"]}
    for experiment in config["experiments"].values():
        experiment["datasets"] = ["synthetic" if d == "double_digits" else d for d in experiment["datasets"]]
    return config
