"""MNIST and Fashion-MNIST: download -> verify -> IDX -> PNG -> manifest against tiny IDX files in
the real format served over HTTP on 127.0.0.1, the damaged-file paths, the registered sources
against torchvision's, and one tiny training run on train/test splits that share their classes."""

from __future__ import annotations

import dataclasses
import gzip
import math
import re

import numpy as np
import pytest
from PIL import Image

from dmlrepro.data import ManifestDataset
from dmlrepro.data.benchmarks import BENCHMARKS, LayoutError, prepare_benchmark
from dmlrepro.data.cli import main as cli_main
from dmlrepro.data.download import ChecksumError
from dmlrepro.data.idx import FILES, RAW_DIR, IdxError
from dmlrepro.data.manifest import ManifestError
from dmlrepro.data.registry import prepare

from ..train.conftest import tiny_config
from .conftest import gz, idx_bytes, md5_of, tiny_mnist
from .test_benchmarks import assert_not_prepared, check_manifest, serve


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_prepare_over_http(tmp_path, server, name):
    tiny = tiny_mnist(name)
    urls = serve(server, tiny)
    path = prepare(name, tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, progress=False)
    assert path == tmp_path / name / "manifest.csv"
    m = check_manifest(tmp_path, tiny)
    for i, p in enumerate(m.paths):  # each PNG holds the IDX bytes exactly, as one grey channel
        with Image.open(m.abspath(i)) as im:
            assert im.mode == "L" and im.format == "PNG"
            assert np.array_equal(np.asarray(im), tiny.pixels[p])
    ds = ManifestDataset(m, split="test")  # the loader gives 3 equal channels
    img, label, _ = ds[0]
    assert tuple(img.shape) == (3, 28, 28) and label == m.labels[m.indices("test")[0]]
    assert all(np.array_equal(img[c].numpy(), tiny.pixels[ds.paths[0]]) for c in range(3))
    # not class-disjoint: the same 10 classes in both splits
    assert m.classes("train").tolist() == m.classes("test").tolist() == list(range(10))
    for fname, data in tiny.files.items():  # the verified .gz files: kept in archives/, copied to raw/
        assert (tmp_path / name / "archives" / fname).read_bytes() == data
        assert (tmp_path / name / RAW_DIR / fname).read_bytes() == data
    n, inode = len(server.requests), path.stat().st_ino  # a second call: no request, nothing rewritten
    assert prepare(name, tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, progress=False) == path
    assert len(server.requests) == n and path.stat().st_ino == inode


@pytest.mark.parametrize("name, cls", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_registered_files_are_torchvisions(name, cls):
    """File names, md5s and URL (the first mirror) as torchvision has them; the reader reads those files."""
    import torchvision.datasets

    tv = getattr(torchvision.datasets, cls)
    res = BENCHMARKS[name].resources
    assert [(r.filename, r.md5) for r in res] == [tuple(x) for x in tv.resources]
    assert [r.urls for r in res] == [(tv.mirrors[0] + f,) for f, _ in tv.resources]
    assert [(r.extract_to, r.place_at) for r in res] == [(None, f"{RAW_DIR}/{f}") for f, _ in tv.resources]
    assert sorted(f for pair in FILES.values() for f in pair) == sorted(f for f, _ in tv.resources)


def test_wrong_md5_official_default(tmp_path, server):
    """The tiny files do not have the real md5s, which stay the default."""
    tiny = tiny_mnist()
    with pytest.raises(ChecksumError) as e:
        prepare("mnist", tmp_path, urls=serve(server, tiny), progress=False)
    msg = str(e.value)
    assert "train-images-idx3-ubyte.gz" in msg and "f68b3c2dcbeaaa9fbdd348bbdeb94873" in msg
    assert md5_of(tiny.files["train-images-idx3-ubyte.gz"]) in msg
    assert_not_prepared(tmp_path, "mnist")
    assert list((tmp_path / "mnist" / "archives").iterdir()) == []  # no .part, no unverified file


def _labels(raw: bytes, index: int, value: int) -> bytes:
    b = bytearray(raw)
    b[8 + index] = value
    return bytes(b)


DAMAGE = [  # file, edit of the uncompressed IDX bytes (or "gz": cut the .gz, "raw": not gzipped), message
    pytest.param(
        "train-images-idx3-ubyte.gz",
        lambda b: b[:-100],
        r"train-images-idx3-ubyte.gz: truncated data: the header declares images of shape \(30, 28, 28\) "
        r"= 23520 bytes, the file holds 23420",
        id="truncated-data",
    ),
    pytest.param(
        "t10k-images-idx3-ubyte.gz",
        lambda b: b[:10],
        r"t10k-images-idx3-ubyte.gz: truncated header: 10 bytes",
        id="truncated-header",
    ),
    pytest.param(
        "t10k-labels-idx1-ubyte.gz",
        lambda b: b + b"\0",
        r"t10k-labels-idx1-ubyte.gz: trailing bytes",
        id="trailing-bytes",
    ),
    pytest.param(
        "train-images-idx3-ubyte.gz", "gz", r"train-images-idx3-ubyte.gz: truncated gzip stream", id="truncated-gzip"
    ),
    pytest.param(
        "train-labels-idx1-ubyte.gz", "raw", r"train-labels-idx1-ubyte.gz: not a readable gzip file", id="not-gzip"
    ),
    pytest.param(
        "t10k-labels-idx1-ubyte.gz",
        lambda b: (2051).to_bytes(4, "big") + b[4:],
        r"t10k-labels-idx1-ubyte.gz: bad magic number 2051, expected 2049",
        id="labels-magic",
    ),
    pytest.param(
        "train-images-idx3-ubyte.gz",
        lambda b: (2049).to_bytes(4, "big") + b[4:],
        r"train-images-idx3-ubyte.gz: bad magic number 2049, expected 2051",
        id="images-magic",
    ),
    pytest.param(
        "train-labels-idx1-ubyte.gz",
        lambda b: idx_bytes(np.frombuffer(b, np.uint8, offset=8)[:-1], 2049),
        r"train-images-idx3-ubyte.gz holds 30 images but train-labels-idx1-ubyte.gz holds 29 labels",
        id="count-mismatch",
    ),
    pytest.param(
        "t10k-labels-idx1-ubyte.gz",
        lambda b: _labels(b, 3, 10),
        r"t10k-labels-idx1-ubyte.gz: label 10 at index 3 \(1 such\); expected 0-9",
        id="label-out-of-range",
    ),
    pytest.param(
        "t10k-images-idx3-ubyte.gz",
        lambda b: idx_bytes(np.zeros((20, 20, 20), np.uint8), 2051),
        r"t10k-images-idx3-ubyte.gz: images of 20x20 px, expected 28x28",
        id="not-28px",
    ),
]


@pytest.mark.parametrize("fname, edit, match", DAMAGE)
def test_damaged_idx(tmp_path, server, fname, edit, match):
    """md5 made to match the damaged file: the IDX reader itself must name the file and the damage,
    before any PNG is installed."""
    tiny = tiny_mnist()
    raw = gzip.decompress(tiny.files[fname])
    if edit == "gz":
        tiny.files[fname] = tiny.files[fname][:-20]
    elif edit == "raw":
        tiny.files[fname] = raw
    else:
        tiny.files[fname] = gz(edit(raw))
    with pytest.raises(IdxError, match=match) as e:
        prepare("mnist", tmp_path, urls=serve(server, tiny), md5=tiny.md5, strict_counts=False, progress=False)
    assert isinstance(e.value, LayoutError)
    assert_not_prepared(tmp_path, "mnist")


def test_strict_counts(tmp_path, server):
    tiny = tiny_mnist()
    urls = serve(server, tiny)
    with pytest.raises(ManifestError) as e:
        prepare("mnist", tmp_path, urls=urls, md5=tiny.md5, progress=False)  # strict by default
    msg = str(e.value)
    for part in (
        "images: expected 70000, got 50",
        "train_images: expected 60000, got 30",
        "test_images: expected 10000, got 20",
        "--no-strict-counts",
    ):
        assert part in msg
    assert "classes: expected" not in msg  # 10 classes in each split, as expected
    assert_not_prepared(tmp_path, "mnist")
    # strict mode with the counts this data really has goes through the same code path
    bench = dataclasses.replace(
        BENCHMARKS["mnist"],
        expected_counts={
            "images": 50,
            "classes": 10,
            "train_images": 30,
            "train_classes": 10,
            "test_images": 20,
            "test_classes": 10,
        },
    )
    prepare_benchmark(bench, tmp_path, urls=urls, md5=tiny.md5, strict_counts=True, progress=False)
    check_manifest(tmp_path, tiny)
    prepare("mnist", tmp_path / "b", urls=urls, md5=tiny.md5, strict_counts=False, progress=False)
    check_manifest(tmp_path / "b", tiny)


def test_progress_bar(tmp_path, server, capsys):
    tiny = tiny_mnist()
    urls = serve(server, tiny)
    prepare("mnist", tmp_path / "a", urls=urls, md5=tiny.md5, strict_counts=False, progress=False)
    assert "write PNGs" not in capsys.readouterr().err
    prepare("mnist", tmp_path / "b", urls=urls, md5=tiny.md5, strict_counts=False, progress=True)
    assert re.search(r"write PNGs: 100%.*50/50", capsys.readouterr().err)


def test_cli(tmp_path, server, capsys):
    tiny = tiny_mnist("fashion_mnist")
    serve(server, tiny)
    md5 = [f"--md5={f}={v}" for f, v in tiny.md5.items()]
    root = str(tmp_path)
    assert cli_main(["prepare", "fashion_mnist", "--root", root, "--url", server.url, "--quiet"] + md5) == 1
    assert "expected 70000" in capsys.readouterr().err
    assert (
        cli_main(
            ["prepare", "fashion_mnist", "--root", root, "--url", server.url, "--quiet", "--no-strict-counts"] + md5
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "images=50" in out and "train_classes=10" in out and "test_classes=10" in out
    assert cli_main(["datasets", "--root", root]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^fashion_mnist +prepared +Fashion-MNIST: ", out, re.M)
    assert re.search(r"^mnist +not prepared +MNIST: .*ossci-datasets", out, re.M)
    assert {len(re.match(r"\S+ +", line).group()) for line in out.splitlines()} == {len("fashion_mnist ")}  # aligned


@pytest.mark.slow
def test_train_on_shared_classes(tmp_path, server):
    """A tiny run on the prepared tiny MNIST: training on train, retrieval on test (the same classes)."""
    from dmlrepro.evaluation import load_embeddings
    from dmlrepro.train import train_run

    tiny = tiny_mnist()
    prepare("mnist", tmp_path, urls=serve(server, tiny), md5=tiny.md5, strict_counts=False, progress=False)
    cfg = tiny_config(
        tmp_path,
        dataset__name="mnist",
        dataset__image_size=28,
        dataset__resize=28,
        dataset__batch_size=10,
        epochs=1,
        steps_per_epoch=2,
    )
    res = train_run(cfg, tmp_path / "run", progress=False)
    assert res["status"] == "completed"
    assert math.isfinite(res["metrics"]["recall@1"]) and 0.0 <= res["metrics"]["recall@1"] <= 1.0
    emb = load_embeddings(tmp_path / "run" / "embeddings_test.npz")
    assert len(emb.labels) == 20 and sorted(set(emb.labels.tolist())) == list(range(10))
    assert np.isfinite(emb.embeddings).all()
