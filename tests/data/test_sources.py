"""The workflow config's `sources` (docs/workflow.md#config): a benchmark's files from a given URL or file,
as `dmlrepro prepare --url/--archive/--md5/--no-strict-counts` take them; never part of a run's identity."""

from __future__ import annotations

import pytest
import yaml

from dmlrepro.data.manifest import read_manifest
from dmlrepro.data.registry import check_sources, prepare, source_arguments
from dmlrepro.run_table import RunTable
from dmlrepro.selection import DOWNLOAD, MANUAL, dataset_status, select

from .conftest import tiny_cub

TINY = "tests/workflow/tiny.yaml"


def test_an_entry_becomes_prepares_arguments():
    entry = {"url": "http://127.0.0.1:8000/CUB_200_2011.tgz", "md5": {"CUB_200_2011.tgz": None}, "strict_counts": False}
    assert source_arguments("cub200", entry) == {
        "urls": ["http://127.0.0.1:8000/CUB_200_2011.tgz"],
        "md5": {"CUB_200_2011.tgz": None},
        "strict_counts": False,
    }
    assert source_arguments("cars196", {"archive": ["/a/car_ims.tgz", "/a/cars_annos.mat"]}) == {
        "archives": ["/a/car_ims.tgz", "/a/cars_annos.mat"]
    }
    assert source_arguments("cub200", None) == {} and source_arguments("cub200", {}) == {}


@pytest.mark.parametrize("name", ["synthetic", "cub"])
def test_a_source_for_a_dataset_without_files_is_a_config_error(name):
    with pytest.raises(ValueError, match=rf"config sources\.{name}: not a dataset whose files are fetched"):
        check_sources({"cub200": {"url": "http://x/"}, name: {"url": "http://x/"}})


def test_a_served_archive_is_prepared_from_its_entry(tmp_path, server):
    """A small archive in CUB's real layout: the published md5 and counts would refuse it; the entry's
    md5 null and strict_counts false accept it, and the file comes from the entry's URL."""
    tiny = tiny_cub()
    server.files["CUB_200_2011.tgz"] = tiny.files["CUB_200_2011.tgz"]
    entry = {"url": server.url + "CUB_200_2011.tgz", "md5": {"CUB_200_2011.tgz": None}, "strict_counts": False}
    manifest = read_manifest(prepare("cub200", tmp_path, progress=False, **source_arguments("cub200", entry)))
    assert list(zip(manifest.paths, manifest.labels.tolist(), manifest.splits.tolist())) == tiny.rows
    assert [path for path, _ in server.requests] == ["CUB_200_2011.tgz"]


def test_a_url_or_file_makes_a_manual_dataset_preparable(tmp_path):
    assert dataset_status("cars196", str(tmp_path)).status == MANUAL
    assert dataset_status("cars196", str(tmp_path), {"url": "https://mirror/cars/"}).status == DOWNLOAD
    assert dataset_status("cars196", str(tmp_path), {"md5": {"car_ims.tgz": None}}).status == MANUAL  # no file


def test_sources_change_no_run_id(tmp_path):
    config = {**yaml.safe_load(open(TINY)), "data_root": str(tmp_path)}
    served = {**config, "sources": {"cub200": {"url": "http://127.0.0.1:8000/", "strict_counts": False}}}
    assert RunTable(served).runs.keys() == RunTable(config).runs.keys()


def test_a_source_selects_a_dataset_that_has_no_download(tmp_path):
    config = {**yaml.safe_load(open(TINY)), "data_root": str(tmp_path)}
    config["datasets"]["cars196"] = {"dataset": {"name": "cars196"}}
    first = next(iter(config["experiments"]))
    config["experiments"] = {first: {**config["experiments"][first], "datasets": ["synthetic", "cars196"]}}
    assert select(config).config["experiments"][first]["datasets"] == ["synthetic"]  # left out: not placed
    served = select({**config, "sources": {"cars196": {"url": "https://mirror/cars/"}}})
    assert served.config["experiments"][first]["datasets"] == ["synthetic", "cars196"]
    assert served.reasons == {}
