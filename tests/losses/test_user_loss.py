"""A loss of your own without forking (docs/tasks/own-loss.md): the worked example of config/examples/, copied
into a temporary folder outside the package as a user's module, is named by its import path
``loss.name: my_losses:CentredSoftmax``. Its config resolves, its loss builds and trains a step, its method joins
PFML Table 1 and RSW Table I of the embedded default, and its claim (a paper of the user's naming) validates."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
import yaml

from dmlrepro.cli import main
from dmlrepro.losses import proxy_points
from dmlrepro.losses.registry import REGISTRY
from dmlrepro.nested import deep_merge
from dmlrepro.report.claims import check_claims, load_catalogue, read_catalogue
from dmlrepro.report.sections import check_report
from dmlrepro.runs import resolve_runs, validate_workflow_config
from dmlrepro.train.config import ConfigError, resolve_run_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "config" / "examples"
PATH = "my_losses:CentredSoftmax"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """config/examples/my_losses.py as a user's module in a folder of its own on the import path; its
    declarations and the module withdrawn afterwards."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    shutil.copy(EXAMPLES / "my_losses.py", folder / "my_losses.py")
    monkeypatch.syspath_prepend(str(folder))
    before = set(REGISTRY)
    yield folder
    for name in set(REGISTRY) - before:
        REGISTRY.pop(name)
    sys.modules.pop("my_losses", None)


def _run_config(name: str = PATH, **hparams) -> dict:
    return {
        "model": {
            "backbone": "tiny_cnn",
            "backbone_kwargs": {"widths": [8, 8], "strides": [2, 2]},
            "embedding_size": 4,
        },
        "loss": {"name": name, "hparams": hparams},
        "optimizer": {"name": "sgd", "lr": 0.1},
    }


def test_the_import_path_resolves_and_names_the_run(user_module):
    resolved = resolve_run_config(_run_config(temperature=0.5))
    assert resolved["loss"] == {"name": PATH, "hparams": {"temperature": 0.5}}  # the run id hashes the path
    assert REGISTRY[PATH].paper.key == "mine" and REGISTRY[PATH].build.__module__ == "my_losses"
    with pytest.raises(ConfigError, match="loss.hparams.temperature"):  # annotated float: the config check's
        resolve_run_config(_run_config(temperature="warm"))


@pytest.mark.parametrize(
    "name, says",
    [
        ("not_a_module_anywhere:Loss", "cannot import 'not_a_module_anywhere'.*PYTHONPATH"),
        ("my_losses:Missing", "module 'my_losses' has no 'Missing'"),
        ("my_losses:MINE", "MINE is not declared; decorate it with dmlrepro.losses.register_loss"),
        ("my_losses:", "expected an import path package.module:ClassName"),
    ],
)
def test_a_bad_import_path_names_what_is_wrong(user_module, name, says):
    with pytest.raises(ConfigError, match=f"loss.name = '{name}': {says}"):
        resolve_run_config(_run_config(name))


def test_the_loss_builds_equals_its_equation_and_trains_a_step(user_module):
    from dmlrepro.train.model_and_loss import build_run_loss, build_run_model
    from dmlrepro.train.optim import build_optimizer, group_lrs, linked_groups, named_groups, set_lrs

    cfg = resolve_run_config(_run_config(temperature=0.1))
    model, loss = build_run_model(cfg), build_run_loss(cfg, 3, 4)
    images, labels = (
        torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0)),
        torch.tensor([0, 0, 1, 1, 2, 2]),
    )
    embeddings = model(images)
    # the docstring's equation in float64: cross-entropy of −‖x̂ − p̂_c‖² / T
    x = embeddings.detach().double().numpy()
    p = loss.proxies.detach().double().numpy()
    x, p = x / np.linalg.norm(x, axis=1, keepdims=True), p / np.linalg.norm(p, axis=1, keepdims=True)
    logits = -((x[:, None, :] - p[None, :, :]) ** 2).sum(-1) / 0.1
    expected = np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(6), labels.numpy()])
    value = loss(embeddings, labels)
    assert value.item() == pytest.approx(expected, rel=1e-5)
    # its proxies are the `loss` group (lr × lr_mult.loss) and its declared proxy points
    groups = named_groups(model, loss)
    assert groups["loss"] == [loss.proxies] and proxy_points(loss)[0].shape == (3, 4)
    optimizer = build_optimizer(cfg, groups, linked_groups(loss))
    set_lrs(optimizer, group_lrs(cfg, 1))
    before = [parameter.detach().clone() for group in groups.values() for parameter in group]
    value.backward()
    optimizer.step()
    after = [parameter.detach() for group in groups.values() for parameter in group]
    assert all(not torch.equal(old, new) for old, new in zip(before, after))  # the trunk, the head, the proxies
    assert torch.isfinite(loss(model(images), labels))


def _workflow_config() -> dict:
    """config/config.yaml with config/examples/own_loss.yaml merged over it, as `snakemake --configfile A B` merges."""
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    return deep_merge(base, yaml.safe_load((EXAMPLES / "own_loss.yaml").read_text()))


def test_the_method_joins_pfml_table1_and_rsw_table1(user_module):
    config = _workflow_config()
    validate_workflow_config(config)
    for name in ("pfml_table1", "rsw_table1"):
        check_report(name, config["experiments"][name])
    runs = resolve_runs(config, ["pfml_table1", "rsw_table1"])
    mine = [run for run in runs.values() if run.method == "centred_softmax"]
    assert sorted((next(iter(run.experiments)), run.seed) for run in mine) == [
        (experiment, seed) for experiment in ("pfml_table1", "rsw_table1") for seed in (0, 1, 2)
    ]
    assert {run.config["loss"]["name"] for run in mine} == {PATH}
    # the papers' runs keep their ids: the overlay only adds a method
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate_workflow_config(base)
    theirs = resolve_runs(base, ["pfml_table1", "rsw_table1"])
    assert set(runs) - {run.run_id for run in mine} == set(theirs)


def test_the_users_claim_validates(user_module):
    catalogue = EXAMPLES / "own_loss_claims.yaml"
    jsonschema.validate(
        read_catalogue(catalogue), yaml.safe_load((ROOT / "workflow/schemas/claims.schema.yaml").read_text())
    )
    config = _workflow_config()
    validate_workflow_config(config)
    assert config["claims"]["catalogue"] == "config/examples/own_loss_claims.yaml"
    claims = load_catalogue(catalogue)
    assert [claim["paper"] for claim in claims] == ["Mine"]
    check_claims(claims, config, config["claims"]["scale"])
    with pytest.raises(ValueError, match="unknown method|method"):  # a cell the config lacks is refused
        check_claims(claims, yaml.safe_load((ROOT / "config" / "config.yaml").read_text()), "miniature")


def test_dmlrepro_losses_shows_the_users_loss(user_module, capsys):
    assert main(["losses", PATH]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [PATH, "Your", "Name,", "Your", "Paper's", "Title,", "2026"]
    assert "written from the paper" in out and "defaults: temperature=0.1" in out


def test_the_example_module_is_the_one_the_docs_show():
    """docs/tasks/own-loss.md walks through these files."""
    page = (ROOT / "docs" / "tasks" / "own-loss.md").read_text()
    for name in (
        "config/examples/my_losses.py",
        "config/examples/own_loss.yaml",
        "config/examples/own_loss_claims.yaml",
    ):
        assert name in page and (ROOT / name).is_file()
    assert PATH in page


def test_dmlrepro_runs_merges_the_configfiles_as_snakemake_does(user_module, capsys):
    files = [str(ROOT / "config" / "config.yaml"), str(EXAMPLES / "own_loss.yaml")]
    assert main(["runs", "--configfile", *files, "--experiment", "rsw_table1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("centred_softmax-double_digits-tiny_cnn-s") for line in lines) == 3
    assert lines[-1] == f"{len(lines) - 1} runs"
