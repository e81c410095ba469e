from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from dmlrepro.data.dataset import ManifestDataset, load_image
from dmlrepro.data.manifest import ManifestError, read_manifest, write_manifest
from dmlrepro.data.splits import split_indices
from dmlrepro.data.transforms import build_transform


@pytest.fixture
def tiny(tmp_path):
    rng = np.random.default_rng(0)
    paths, labels, splits, arrays = [], [], [], []
    for i in range(12):
        a = rng.integers(0, 256, (10, 14, 3), dtype=np.uint8)
        ext = ["png", "bmp", "png", "tiff"][i % 4]  # bmp/tiff: decode_image cannot, PIL can
        rel = f"img/{i}.{ext}"
        (tmp_path / "img").mkdir(exist_ok=True)
        Image.fromarray(a).save(tmp_path / rel)
        paths.append(rel)
        labels.append(i // 3)
        splits.append("train" if i < 6 else "test")
        arrays.append(a)
    (tmp_path / "img" / "grey.png").parent.mkdir(exist_ok=True)
    Image.fromarray(arrays[0][..., 0]).save(tmp_path / "img" / "grey.png")
    (
        paths.append("img/grey.png"),
        labels.append(3),
        splits.append("test"),
        arrays.append(np.repeat(arrays[0][..., :1], 3, -1)),
    )
    return write_manifest(tmp_path / "manifest.csv", paths, labels, splits), arrays


def test_items_match_files(tiny):
    path, arrays = tiny
    ds = ManifestDataset(path)
    assert len(ds) == 13
    for i in range(len(ds)):
        img, label, idx = ds[i]
        assert img.dtype == torch.uint8 and img.shape == (3, 10, 14)
        assert np.array_equal(img.permute(1, 2, 0).numpy(), arrays[i])  # lossless formats: exact pixels
        assert label == i // 3 if i < 12 else label == 3
        assert idx == i


def test_cache_images_reads_each_file_once_and_survives_in_place_transforms(tiny, monkeypatch):
    import dmlrepro.data.dataset as dataset_module

    path, arrays = tiny
    reads = []
    real = dataset_module.load_image
    monkeypatch.setattr(dataset_module, "load_image", lambda p: reads.append(p) or real(p))

    def scribble(img):  # an in-place transform: must not reach the cache
        img.zero_()
        return img

    cached = ManifestDataset(path, transform=scribble, cache_images=True)
    for _ in range(3):
        assert all(int(cached[i][0].sum()) == 0 for i in range(len(cached)))
    assert len(reads) == 13  # each file decoded once in 3 passes
    plain = ManifestDataset(path, cache_images=True)
    for i in range(len(plain)):
        assert np.array_equal(plain[i][0].permute(1, 2, 0).numpy(), arrays[i])
        assert np.array_equal(plain[i][0].permute(1, 2, 0).numpy(), arrays[i])  # cached copy, same pixels
    reads.clear()
    uncached = ManifestDataset(path)
    uncached[0], uncached[0]
    assert len(reads) == 2


def test_cache_images_is_not_part_of_a_run_id():
    from dmlrepro.runs import config_hash
    from dmlrepro.train import resolve_run_config

    assert config_hash(resolve_run_config({"dataset": {"cache_images": True}})) == config_hash(resolve_run_config({}))


def test_split_subset_transform_pickle_workers(tiny):
    path, _ = tiny
    ds = ManifestDataset(path, split="test", transform=build_transform(False, 8, resize=8))
    assert len(ds) == 7 and ds.labels.tolist() == [2, 2, 2, 3, 3, 3, 3]
    img, label, idx = ds[0]
    assert img.shape == (3, 8, 8) and img.dtype == torch.float32 and idx == 0
    clone = pickle.loads(pickle.dumps(ds))
    assert torch.equal(clone[3][0], ds[3][0])
    batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert torch.cat([b[2] for b in batches]).tolist() == list(range(7))
    m = read_manifest(path)
    sub = ManifestDataset(m, indices=split_indices(m, "train"))
    assert sub.paths == m.paths[:6]


def test_bad_image_names_file(tmp_path):
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    with pytest.raises(OSError, match="broken.jpg: cannot decode"):
        load_image(tmp_path / "broken.jpg")


def test_manifest_validation(tmp_path):
    p = tmp_path / "manifest.csv"
    p.write_text("path,label\na.png,0\n")
    with pytest.raises(ManifestError, match=r"manifest.csv: missing column\(s\) \['split'\]"):
        read_manifest(p)
    p.write_text("path,label,split\na.png,zero,train\n")
    with pytest.raises(ManifestError, match=r"manifest.csv:2: label 'zero' is not an integer"):
        read_manifest(p)
    p.write_text("path,label,split\na.png,0,val\n")
    with pytest.raises(ManifestError, match="split 'val'"):
        read_manifest(p)
    with pytest.raises(ManifestError, match="must be relative"):
        write_manifest(p, ["../a.png"], [0], ["train"])
    with pytest.raises(ManifestError, match="manifest not found"):
        read_manifest(tmp_path / "nothing")


def test_manifest_roundtrip_and_counts(tmp_path):
    p = write_manifest(
        tmp_path / "d" / "manifest.csv",
        ["a b.png", "c,d.png", "e.png"],
        [0, 1, 2],
        ["train", "query", "gallery"],
        item_ids=["id_1", "id_2", "id_2"],
    )
    m = read_manifest(tmp_path / "d")
    assert m.paths == ["a b.png", "c,d.png", "e.png"] and m.item_ids == ["id_1", "id_2", "id_2"]
    assert m.counts() == {
        "images": 3,
        "classes": 3,
        "train_images": 1,
        "train_classes": 1,
        "query_images": 1,
        "query_classes": 1,
        "gallery_images": 1,
        "gallery_classes": 1,
    }
    assert [x.name for x in p.parent.iterdir()] == ["manifest.csv"]  # no temp files left
