"""A run with model.pretrained: standin starts from the cached stand-in: its trunk's initial weights are the
file's, the file is named by its recipe's hash, and a file of another recipe is refused (docs/miniature.md)."""

import pytest
import torch

from dmlrepro.models.standin import load_standin, pretrain
from dmlrepro.standin_recipe import STANDIN, StandinError
from dmlrepro.train.config import resolve_run_config
from dmlrepro.train.model_and_loss import build_run_model

pytestmark = pytest.mark.slow  # trains a (tiny) model
RECIPE = {"classes": {"num_classes": 4, "images_per_class": 4, "size": 16}, "epochs": 1, "batch_size": 8}


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    folder = tmp_path_factory.mktemp("standin")
    summary = pretrain(RECIPE, STANDIN.weights_file(folder, RECIPE), log=lambda *_: None)
    return folder, summary


def _run_model(folder, recipe=RECIPE, **bn):
    cfg = resolve_run_config(
        {
            "model": {
                "backbone": "tiny_cnn",
                "pretrained": "standin",
                "standin": recipe,
                "weights_cache_dir": str(folder),
            },
            "bn_freeze": {"running_stats": True, "affine": True, **bn},
            "warmup_epochs": 1,
            "epochs": 2,
        }
    )
    return cfg, build_run_model(cfg)


def test_file_is_named_by_the_recipe_hash(cached):
    folder, summary = cached
    assert (folder / f"standin-{summary['hash']}.pt").is_file() and summary["hash"] == STANDIN.hash(RECIPE)


def test_a_finetuned_run_starts_from_the_cached_weights(cached):
    folder, _ = cached
    saved = torch.load(STANDIN.weights_file(folder, RECIPE), weights_only=True)["trunk"]
    _, model = _run_model(folder)
    state = model.backbone.state_dict()
    assert set(state) == set(saved)
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    # and not what a fresh initialisation gives
    fresh = build_run_model(resolve_run_config({"model": {"backbone": "tiny_cnn"}}))
    assert not torch.equal(fresh.backbone.state_dict()["features.0.weight"], saved["features.0.weight"])


def test_pretraining_changed_the_trunk(cached):
    """The file holds trained weights: BN running statistics moved off their initial (0, 1)."""
    folder, _ = cached
    saved = torch.load(STANDIN.weights_file(folder, RECIPE), weights_only=True)["trunk"]
    assert not torch.equal(saved["features.1.running_mean"], torch.zeros_like(saved["features.1.running_mean"]))


def test_a_file_of_another_recipe_is_refused(cached, tmp_path):
    folder, _ = cached
    other = {**RECIPE, "seed": 5}
    target = STANDIN.weights_file(tmp_path, other)
    target.write_bytes(STANDIN.weights_file(folder, RECIPE).read_bytes())  # a file under the wrong name
    with pytest.raises(StandinError, match="trained from recipe"):
        _run_model(tmp_path, other)
    with pytest.raises(StandinError, match="not found"):
        _run_model(tmp_path / "empty")


def test_standin_is_refused_for_another_backbone(cached):
    folder, _ = cached
    from dmlrepro.models import build_model

    with pytest.raises(StandinError, match="does not fit"):
        load_standin(build_model(backbone="resnetv2_20"), RECIPE, folder)


NARROW = {"widths": [8, 16, 16], "strides": [2, 2, 2]}


def test_recipe_backbone_kwargs_build_the_trunk_the_run_loads(tmp_path):
    """The recipe's backbone_kwargs shape the pretrained trunk; a run with the same kwargs loads it."""
    recipe = {**RECIPE, "backbone_kwargs": NARROW}
    pretrain(recipe, STANDIN.weights_file(tmp_path, recipe), log=lambda *_: None)
    saved = torch.load(STANDIN.weights_file(tmp_path, recipe), weights_only=True)["trunk"]
    assert saved["features.0.weight"].shape[0] == 8 and STANDIN.hash(recipe) != STANDIN.hash(RECIPE)
    cfg = resolve_run_config(
        {
            "model": {
                "backbone": "tiny_cnn",
                "backbone_kwargs": NARROW,
                "pretrained": "standin",
                "standin": recipe,
                "weights_cache_dir": str(tmp_path),
            }
        }
    )
    model = build_run_model(cfg)
    for key, value in saved.items():
        assert torch.equal(model.backbone.state_dict()[key], value), key


def test_backbone_kwargs_other_than_the_recipes_are_refused(tmp_path):
    from dmlrepro.models import build_model
    from dmlrepro.train.config_checks import ConfigError

    recipe = {**RECIPE, "backbone_kwargs": NARROW}
    with pytest.raises(ConfigError, match="model.standin.backbone_kwargs"):
        resolve_run_config({"model": {"backbone": "tiny_cnn", "pretrained": "standin", "standin": recipe}})
    pretrain(recipe, STANDIN.weights_file(tmp_path, recipe), log=lambda *_: None)
    with pytest.raises(StandinError, match="backbone_kwargs"):
        load_standin(build_model(backbone="tiny_cnn"), recipe, tmp_path)


def test_pretraining_runs_its_own_thread_count_and_restores_the_callers(tmp_path, monkeypatch):
    """The weights depend on torch's thread count, so pretraining always uses PRETRAIN_THREADS."""
    from dmlrepro.models import pretraining, standin

    seen = []
    train = pretraining.train_trunk
    monkeypatch.setattr(
        pretraining, "train_trunk", lambda *args, **kw: seen.append(torch.get_num_threads()) or train(*args, **kw)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pretrain(RECIPE, STANDIN.weights_file(tmp_path, RECIPE), log=lambda *_: None)
        assert seen == [standin.PRETRAIN_THREADS] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
