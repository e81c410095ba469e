"""The digit-pretrained trunk: its recipe (checked, content-addressed), the pretraining images (one
training digit, pixel for pixel, somewhere on the canvas), pretraining on the training digits only,
and loading (the file's recipe and the run's trunk must match)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dmlrepro.data.multidigit import training_digits
from dmlrepro.digit_trunk_recipe import DIGIT_TRUNK, DigitTrunkError
from dmlrepro.models import build_model, digit_trunk
from dmlrepro.models.digit_trunk import load_digit_trunk, place_digits, pretrain

KW = {"widths": [8, 8, 8, 8]}
TINY = {"backbone_kwargs": KW, "epochs": 1, "digits_per_class": 3, "batch_size": 16}


def test_recipe_checked_and_hashed(tmp_path):
    assert DIGIT_TRUNK.resolve({"epochs": 2})["epochs"] == 2
    for bad in ({"nope": 1}, {"dataset": "mnist"}, {"epochs": 0}, {"digits_per_class": 1.5}, {"backbone_kwargs": 3}):
        with pytest.raises(DigitTrunkError):
            DIGIT_TRUNK.resolve(bad)
    assert DIGIT_TRUNK.hash({}) == DIGIT_TRUNK.hash(
        {"epochs": DIGIT_TRUNK.resolve()["epochs"]}
    )  # defaults spelt out: same
    assert DIGIT_TRUNK.hash({}) != DIGIT_TRUNK.hash({"seed": 1})
    assert DIGIT_TRUNK.weights_file(tmp_path, {}).name == f"digits-{DIGIT_TRUNK.hash({})}.pt"


def test_workflow_recipes_only_of_runs_that_use_it():
    class Run:
        def __init__(self, model):
            self.config = {"model": model}

    runs = {"a": Run({"pretrained": "digit_trunk", "digit_trunk": {"seed": 1}}), "b": Run({"pretrained": True})}
    assert DIGIT_TRUNK.workflow_recipes(runs) == {DIGIT_TRUNK.hash({"seed": 1}): DIGIT_TRUNK.resolve({"seed": 1})}


@pytest.mark.parametrize("canvas, size", [((32, 32), 32), ((64, 64), 64), ((84, 84), 32)])
def test_one_digit_somewhere_on_the_canvas(canvas, size):
    digits = torch.randint(1, 256, (6, 14, 14), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    out = place_digits(digits, canvas, size, torch.Generator().manual_seed(1))
    assert out.shape == (6, 3, size, size) and out.dtype == torch.uint8
    assert torch.equal(out[:, 0], out[:, 2])  # grey as RGB
    if canvas != (size, size):
        return
    for img, d in zip(out[:, 0], digits):
        hits = [
            (y, x) for y in range(size - 13) for x in range(size - 13) if torch.equal(img[y : y + 14, x : x + 14], d)
        ]
        assert len(hits) == 1 and int(img.sum()) == int(d.sum())  # the digit once, nothing else


def test_pretrain_and_load(tmp_path):
    path = DIGIT_TRUNK.weights_file(tmp_path, TINY)
    summary = pretrain(TINY, path, log=lambda s: None)
    assert summary["hash"] == DIGIT_TRUNK.hash(TINY) and 0.0 <= summary["train_accuracy"] <= 1.0
    model = build_model(backbone="tiny_cnn", backbone_kwargs=KW, embedding_size=8)
    load_digit_trunk(model, TINY, tmp_path, KW)
    saved = torch.load(path, weights_only=True)["trunk"]
    assert all(torch.equal(v, model.backbone.state_dict()[k]) for k, v in saved.items())
    with pytest.raises(DigitTrunkError, match="not found"):
        load_digit_trunk(model, {**TINY, "seed": 5}, tmp_path, KW)
    with pytest.raises(DigitTrunkError, match="backbone_kwargs"):
        load_digit_trunk(build_model(backbone="tiny_cnn", embedding_size=8), TINY, tmp_path, {})
    built = build_model(  # a run's model section: build_model loads the trunk from the weights folder
        backbone="tiny_cnn",
        backbone_kwargs=KW,
        embedding_size=8,
        pretrained="digit_trunk",
        digit_trunk=TINY,
        weights_cache_dir=str(tmp_path),
    )
    assert all(torch.equal(v, built.backbone.state_dict()[k]) for k, v in saved.items())
    assert built.input_config["weights"] == "digit_trunk"
    with pytest.raises(DigitTrunkError, match="does not fit backbone 'resnetv2_20'"):
        load_digit_trunk(build_model(backbone="resnetv2_20", embedding_size=8), TINY, tmp_path, KW)
    torch.save({**torch.load(path, weights_only=True), "hash": "0" * 12}, path)  # a file renamed from another recipe
    with pytest.raises(DigitTrunkError, match="trained from recipe"):
        load_digit_trunk(model, TINY, tmp_path, KW)


def test_pretraining_runs_its_own_thread_count_and_restores_the_callers(tmp_path, monkeypatch):
    """The weights depend on torch's thread count (docs/miniature.md), so pretraining always uses PRETRAIN_THREADS."""
    seen = []
    train = digit_trunk.train_trunk
    monkeypatch.setattr(
        digit_trunk, "train_trunk", lambda *args, **kw: seen.append(torch.get_num_threads()) or train(*args, **kw)
    )
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pretrain(TINY, DIGIT_TRUNK.weights_file(tmp_path, TINY), log=lambda s: None)
        assert seen == [digit_trunk.PRETRAIN_THREADS] == [2] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_training_digits_only():
    """double_digits' trunk learns from the first half of each of scikit-learn's digits (in file order),
    never from the half its test classes are made of."""
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    first = np.sort(
        np.concatenate([np.flatnonzero(data.target == d)[: (np.sum(data.target == d) + 1) // 2] for d in range(10)])
    )
    grey = (np.rint(data.images[i] * 255 / 16).astype(np.uint8) for i in first)
    expected = np.stack([np.asarray(Image.fromarray(g, "L").resize((14, 14), Image.BILINEAR)) for g in grey])
    images, labels = training_digits("double_digits")
    order = np.lexsort((first, data.target[first]))  # by digit, then file order
    assert np.array_equal(labels, data.target[first][order])
    assert np.array_equal(images, expected[order])
