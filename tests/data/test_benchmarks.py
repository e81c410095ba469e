"""End-to-end download -> verify -> extract -> prepare for CUB, Cars, SOP and In-Shop, against tiny
archives in the real layouts served over HTTP on 127.0.0.1, and every failure path."""

from __future__ import annotations

import dataclasses
import hashlib
import re

import pytest

from dmlrepro.data.archives import ArchiveError
from dmlrepro.data.benchmarks import BENCHMARKS, LayoutError, MissingFileError, prepare_benchmark
from dmlrepro.data.cli import main as cli_main
from dmlrepro.data.download import ChecksumError, DownloadError
from dmlrepro.data.manifest import ManifestError, read_manifest
from dmlrepro.data.registry import prepare

from .conftest import TINY, md5_of, tiny_cub


def serve(server, tiny):
    for fname, data in tiny.files.items():
        server.files[fname] = data
    return [server.url + f for f in tiny.files]


def assert_not_prepared(root, name):
    """Nothing a later run could mistake for a prepared dataset, and no half-extracted folders."""
    ds = root / name
    assert not (ds / "manifest.csv").exists()
    assert not (ds / "prepare_info.json").exists()
    if ds.exists():
        hidden = [p.name for p in ds.iterdir() if p.name.startswith((".staging-", ".extract-"))]
        assert hidden == []
        layout = {
            "CUB_200_2011",
            "car_ims",
            "Stanford_Online_Products",
            "Img",
            "Eval",
            "cars_annos.mat",
            "images",
            "raw",
        }
        assert not layout & {p.name for p in ds.iterdir()}
    with pytest.raises(ManifestError, match="manifest not found"):
        read_manifest(ds)


def check_manifest(root, tiny):
    m = read_manifest(root / tiny.name / "manifest.csv")
    assert list(zip(m.paths, m.labels.tolist(), m.splits.tolist())) == tiny.rows
    if tiny.item_ids is not None:
        assert m.item_ids == tiny.item_ids
    for i in range(len(m)):  # every image is really there, with the bytes of the archive
        assert m.abspath(i).is_file()
    return m


@pytest.mark.parametrize("name", ["cub200", "cars196", "sop", "inshop"])
def test_prepare_over_http(tmp_path, server, name):
    tiny = TINY[name]()
    urls = serve(server, tiny)
    path = prepare(name, tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, progress=False)
    assert path == tmp_path / name / "manifest.csv"
    check_manifest(tmp_path, tiny)
    for fname, data in tiny.files.items():  # archives kept, verified
        assert hashlib.md5((tmp_path / name / "archives" / fname).read_bytes()).hexdigest() == md5_of(data)
    # a second call reuses the prepared dataset without any request
    n = len(server.requests)
    assert prepare(name, tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, progress=False) == path
    assert len(server.requests) == n


def test_inshop_labels_are_class_disjoint_and_queries_match_gallery(tmp_path, server):
    tiny = TINY["inshop"]()
    prepare("inshop", tmp_path, urls=serve(server, tiny), md5=tiny.md5, strict_counts=False, progress=False)
    m = read_manifest(tmp_path / "inshop")
    assert set(m.classes("train")).isdisjoint(m.classes(["query", "gallery"]))
    assert set(m.classes("query")) == set(m.classes("gallery")) == {2, 3}


def test_cars_base_url_and_user_placed_files(tmp_path, server):
    tiny = TINY["cars196"]()
    serve(server, tiny)
    # a base URL (ending in /) serves both files
    prepare("cars196", tmp_path / "a", urls=[server.url], md5=tiny.md5, strict_counts=False, progress=False)
    check_manifest(tmp_path / "a", tiny)
    # files placed by the user where the error message says, no network
    arch = tmp_path / "b" / "cars196" / "archives"
    arch.mkdir(parents=True)
    for f, data in tiny.files.items():
        (arch / f).write_bytes(data)
    n = len(server.requests)
    prepare("cars196", tmp_path / "b", md5=tiny.md5, strict_counts=False, progress=False)
    check_manifest(tmp_path / "b", tiny)
    assert len(server.requests) == n
    # files passed with --archive (a folder holding them)
    code = cli_main(
        ["prepare", "cars196", "--root", str(tmp_path / "c"), "--archive", str(arch), "--quiet", "--no-strict-counts"]
        + [f"--md5={f}={v}" for f, v in tiny.md5.items()]
    )
    assert code == 0
    check_manifest(tmp_path / "c", tiny)


def test_missing_files_message_says_what_to_place_where(tmp_path):
    for name, files in (("cars196", "car_ims.tgz, cars_annos.mat"), ("inshop", "img.zip, list_eval_partition.txt")):
        with pytest.raises(MissingFileError) as e:
            prepare(name, tmp_path, progress=False)
        msg = str(e.value)
        assert f"Place {files} in {tmp_path / name / 'archives'}" in msg
        assert f"prepare {name} --root {tmp_path}" in msg
        assert_not_prepared(tmp_path, name)


def test_wrong_md5_official_default(tmp_path, server):
    """The tiny archive does not have the real md5, which stays the default."""
    tiny = tiny_cub()
    urls = serve(server, tiny)
    with pytest.raises(ChecksumError) as e:
        prepare("cub200", tmp_path, urls=urls, progress=False)
    msg = str(e.value)
    assert (
        "CUB_200_2011.tgz" in msg
        and "97eceeb196236b17998738112f37df78" in msg
        and md5_of(tiny.files["CUB_200_2011.tgz"]) in msg
    )
    assert "download" in msg  # what to do
    assert_not_prepared(tmp_path, "cub200")
    assert list((tmp_path / "cub200" / "archives").iterdir()) == []  # no .part, no unverified file


def test_user_placed_file_with_wrong_md5_is_kept_and_reported(tmp_path):
    tiny = tiny_cub()
    arch = tmp_path / "cub200" / "archives"
    arch.mkdir(parents=True)
    (arch / "CUB_200_2011.tgz").write_bytes(tiny.files["CUB_200_2011.tgz"])
    with pytest.raises(ChecksumError, match=r"CUB_200_2011.tgz: md5 is [0-9a-f]{32}, expected 97eceeb1"):
        prepare("cub200", tmp_path, progress=False)
    assert (arch / "CUB_200_2011.tgz").exists()  # never delete what the user placed
    assert_not_prepared(tmp_path, "cub200")


@pytest.mark.parametrize("name", ["cub200", "sop", "inshop"])
def test_truncated_archive(tmp_path, server, name):
    tiny = TINY[name]()
    fname = next(f for f in tiny.files if f.endswith((".tgz", ".zip")))
    tiny.files[fname] = tiny.files[fname][: len(tiny.files[fname]) * 2 // 3]
    # md5 made to match the truncated bytes: extraction itself must detect the damage
    with pytest.raises(ArchiveError) as e:
        prepare(name, tmp_path, urls=serve(server, tiny), md5=tiny.md5, strict_counts=False, progress=False)
    assert fname in str(e.value) and "truncated or corrupt" in str(e.value)
    assert_not_prepared(tmp_path, name)


@pytest.mark.parametrize("mode, match", [("half", "connection closed after"), ("error500", "500")])
def test_server_error_mid_download(tmp_path, server, mode, match):
    tiny = tiny_cub()
    urls = serve(server, tiny)
    server.mode["CUB_200_2011.tgz"] = mode
    with pytest.raises(DownloadError) as e:
        prepare("cub200", tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, progress=False)
    msg = str(e.value)
    assert match in msg and "CUB_200_2011.tgz" in msg and "place it at" in msg
    assert_not_prepared(tmp_path, "cub200")
    assert not (tmp_path / "cub200" / "archives" / "CUB_200_2011.tgz").exists()
    # the server recovers: the next run resumes from the partial file and succeeds
    server.mode["CUB_200_2011.tgz"] = "ok"
    prepare("cub200", tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, progress=False)
    check_manifest(tmp_path, tiny)
    if mode == "half":
        assert server.requests[-1][1] is not None and server.requests[-1][1].startswith("bytes=")


def test_resume_within_one_run(tmp_path, server):
    tiny = tiny_cub(per_class=8)
    urls = serve(server, tiny)
    server.mode["CUB_200_2011.tgz"] = "half_once"
    prepare("cub200", tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, progress=False)
    check_manifest(tmp_path, tiny)
    half = len(tiny.files["CUB_200_2011.tgz"]) // 2
    assert server.requests == [("CUB_200_2011.tgz", None), ("CUB_200_2011.tgz", f"bytes={half}-")]


@pytest.mark.parametrize(
    "drop, match",
    [
        ("CUB_200_2011/image_class_labels.txt", "expected CUB_200_2011/image_class_labels.txt"),
        (
            "CUB_200_2011/images/001.Bird_1/Bird_1_0000.jpg",
            "'CUB_200_2011/images/001.Bird_1/Bird_1_0000.jpg' is listed",
        ),
    ],
)
def test_wrong_layout(tmp_path, server, drop, match):
    tiny = tiny_cub(drop=drop)
    with pytest.raises((LayoutError, FileNotFoundError), match=match) as e:
        prepare("cub200", tmp_path, urls=serve(server, tiny), md5=tiny.md5, strict_counts=False, progress=False)
    assert "download it again" in str(e.value) or "official release" in str(e.value)
    assert_not_prepared(tmp_path, "cub200")


def test_wrong_layout_other_archive(tmp_path, server):
    """A SOP zip served as CUB: md5 accepted by override, the layout check stops it."""
    sop = TINY["sop"]()
    server.files["CUB_200_2011.tgz"] = sop.files["Stanford_Online_Products.zip"]
    with pytest.raises(
        LayoutError, match=r"CUB_200_2011.tgz: expected CUB_200_2011/images.txt .*Stanford_Online_Products"
    ):
        prepare(
            "cub200",
            tmp_path,
            urls=[server.url + "CUB_200_2011.tgz"],
            md5={"CUB_200_2011.tgz": None},
            strict_counts=False,
            progress=False,
        )
    assert_not_prepared(tmp_path, "cub200")


def test_strict_counts(tmp_path, server):
    tiny = tiny_cub()
    urls = serve(server, tiny)
    with pytest.raises(ManifestError) as e:
        prepare("cub200", tmp_path, urls=urls, md5=tiny.md5, progress=False)  # strict by default
    msg = str(e.value)
    assert "images: expected 11788, got 12" in msg and "train_classes: expected 100, got 2" in msg
    assert "--no-strict-counts" in msg
    assert_not_prepared(tmp_path, "cub200")
    # strict mode with the counts this archive really has goes through the same code path
    bench = dataclasses.replace(
        BENCHMARKS["cub200"],
        expected_counts={
            "images": 12,
            "classes": 4,
            "train_images": 6,
            "test_images": 6,
            "train_classes": 2,
            "test_classes": 2,
        },
    )
    prepare_benchmark(bench, tmp_path, urls=urls, md5=tiny.md5, strict_counts=True, progress=False)
    check_manifest(tmp_path, tiny)


def test_force_reprepares(tmp_path, server):
    tiny = tiny_cub()
    urls = serve(server, tiny)
    prepare("cub200", tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, progress=False)
    (tmp_path / "cub200" / "CUB_200_2011" / "images.txt").write_text("garbage")
    prepare("cub200", tmp_path, urls=urls, md5=tiny.md5, strict_counts=False, force=True, progress=False)
    check_manifest(tmp_path, tiny)


def test_cli(tmp_path, server, capsys):
    tiny = tiny_cub()
    url = serve(server, tiny)[0]
    md5 = tiny.md5["CUB_200_2011.tgz"]
    assert (
        cli_main(
            ["prepare", "cub200", "--root", str(tmp_path), "--url", url, "--md5", f"CUB_200_2011.tgz={md5}", "--quiet"]
        )
        == 1
    )
    assert "expected 11788" in capsys.readouterr().err
    assert (
        cli_main(
            [
                "prepare",
                "cub200",
                "--root",
                str(tmp_path),
                "--url",
                url,
                "--md5",
                f"CUB_200_2011.tgz={md5}",
                "--no-strict-counts",
                "--quiet",
            ]
        )
        == 0
    )
    assert "images=12" in capsys.readouterr().out
    assert cli_main(["datasets", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^cub200 +prepared ", out, re.M) and re.search(r"^sop +not prepared ", out, re.M)
    assert cli_main(["prepare", "cub200", "--root", str(tmp_path), "--seed", "3"]) == 2
    assert "--seed only apply to generated datasets" in capsys.readouterr().err
    # a generated dataset names the options it does take: double_digits' canvas is the protocol's
    assert cli_main(["prepare", "double_digits", "--root", str(tmp_path), "--size", "16"]) == 2
    assert "double_digits does not take --size (it takes --seed, --images-per-class)" in capsys.readouterr().err
    assert not (tmp_path / "double_digits").exists()


def test_wrong_layout_cars_mat(tmp_path, server):
    tiny = TINY["cars196"]()
    tiny.files["cars_annos.mat"] = _bad_mat()
    serve(server, tiny)
    with pytest.raises(LayoutError, match=r"cars_annos.mat: cannot read the 'annotations' struct"):
        prepare(
            "cars196",
            tmp_path,
            urls=[server.url],
            md5={"car_ims.tgz": None, "cars_annos.mat": None},
            strict_counts=False,
            progress=False,
        )
    assert_not_prepared(tmp_path, "cars196")


def _bad_mat() -> bytes:
    import io

    from scipy.io import savemat

    buf = io.BytesIO()
    savemat(buf, {"class_names": ["a", "b"]})
    return buf.getvalue()


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda t: b"99" + t[t.index(b"\n") :], "declares 99 images but lists 9"),
        (lambda t: t.replace(b"evaluation_status", b"status", 1), "line 2 must be the header"),
        (lambda t: t.replace(b"  query", b"  val", 1), r"unknown evaluation_status \['val'\]"),
    ],
)
def test_wrong_layout_inshop_partition(tmp_path, server, edit, match):
    tiny = TINY["inshop"]()
    tiny.files["list_eval_partition.txt"] = edit(tiny.files["list_eval_partition.txt"])
    with pytest.raises(LayoutError, match=match):
        prepare("inshop", tmp_path, urls=serve(server, tiny), md5=tiny.md5, strict_counts=False, progress=False)
    assert_not_prepared(tmp_path, "inshop")
