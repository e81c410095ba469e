"""dmlrepro.config_names: the torch-free copies of the registries' names equal the registries, and
resolving the workflow's runs (what the Snakefile does while it parses) imports no trunk registry."""

import subprocess
import sys
from pathlib import Path

from dmlrepro import config_names

ROOT = Path(__file__).resolve().parents[2]


def test_backbone_and_weight_names_are_the_registries():
    from dmlrepro.models import ALIASES, BACKBONES, WEIGHTS

    assert sorted(config_names.BACKBONE_NAMES) == sorted(BACKBONES)
    assert config_names.BACKBONE_ALIASES is ALIASES
    assert sorted(config_names.WEIGHT_NAMES) == sorted(WEIGHTS)


def test_loss_and_corruption_names_are_the_registries():
    from dmlrepro.data.corruptions import CORRUPTIONS
    from dmlrepro.losses import LOSS_NAMES

    assert sorted(config_names.LOSS_NAMES) == sorted(LOSS_NAMES)
    assert sorted(config_names.CORRUPTION_NAMES) == sorted(CORRUPTIONS)


def test_the_config_check_and_the_code_share_their_choices():
    from dmlrepro.asap import kcenter, schedule
    from dmlrepro.evaluation import clustering, knn

    assert kcenter.FIRST_INIT is config_names.FIRST_INIT and kcenter.SMALL_BUDGET is config_names.SMALL_BUDGET
    assert schedule.ANCHORS is config_names.ANCHORS
    assert knn.BACKENDS is config_names.KNN_BACKENDS
    assert clustering.nmi_options is config_names.nmi_options


def test_resolving_the_workflows_runs_imports_no_trunk_registry():
    script = (
        "import sys, yaml\nfrom dmlrepro.runs import resolve_runs\n"
        "for path in sys.argv[1:]:\n    resolve_runs(yaml.safe_load(open(path)))\n"
        "print(sorted(m for m in ('dmlrepro.models', 'dmlrepro.data.corruptions', 'timm', 'torchvision') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(ROOT / "config/config.yaml"), str(ROOT / "config/paper.yaml")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout.strip() == "[]"
