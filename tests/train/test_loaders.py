"""Loaders built once per run, the shared image cache, the checkpoint policy and the stop flag
inside evaluation and ASAP's pool embedding.

References are independent of the code under test: decoded images come from the data layer's
decoder, embeddings from a plain loop over the dataset, and every interrupted or differently
loaded run is compared with an uninterrupted run with 0 workers and no cache, bit for bit (CPU).
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch

from dmlrepro.train import RunInterrupted, list_checkpoints, read_checkpoint, train_run
from dmlrepro.train.checkpoint import checkpoint_name
from dmlrepro.train.hooks import CheckpointPolicy

from ..conftest import state_differences


# -- the checkpoint policy (pure) ----------------------------------------------------------------
def _policy(overhead, floor_mb=0.0):
    now = [0.0]
    return CheckpointPolicy(overhead, floor_mb, clock=lambda: now[0]), now


def test_policy_keeps_checkpoint_time_within_the_share_of_wall_time():
    pol, now = _policy(0.02)
    assert pol.due()  # the first one: its cost is not known yet
    pol.record(1.0, 200 * 2**20)  # a 1 s, 200 MiB checkpoint at t = 0
    now[0] = 10.0
    assert not pol.due()  # 1 s spent + 1 s more > 2 % of 10 s
    now[0] = 99.0
    assert not pol.due()  # 2 s > 1.98 s
    now[0] = 100.0
    assert pol.due()  # 2 s <= 2 % of 100 s
    pol.record(1.0, 200 * 2**20)
    now[0] = 149.0
    assert not pol.due()  # 3 s > 2.98 s
    now[0] = 150.0
    assert pol.due()


def test_policy_extremes_and_small_checkpoints():
    pol, now = _policy(1.0)
    pol.record(5.0, 2**30)
    assert pol.due()  # 1: every epoch
    pol, now = _policy(0.0)
    assert not pol.due()  # 0: never (the loop writes the last one and a signal's)
    pol, now = _policy(0.02, floor_mb=16)
    pol.record(3.0, 15 * 2**20)
    now[0] = 1.0
    assert pol.due()  # below the size floor: cheap whatever it took
    pol.record(3.0, 17 * 2**20)
    assert not pol.due()


# -- the Embedder against plain loops ----------------------------------------------------------------
def _model():
    from dmlrepro.train.config import resolve_run_config
    from dmlrepro.train.model_and_loss import build_run_model

    torch.manual_seed(0)
    cfg = resolve_run_config(
        {
            "dataset": {"name": "digits"},
            "loss": {"name": "pfml"},
            "model": {
                "backbone": "tiny_cnn",
                "backbone_kwargs": {"widths": [8, 8, 8], "strides": [2, 2, 2]},
                "embedding_size": 8,
            },
        }
    )
    return build_run_model(cfg)


def _digits(data_root, train: bool, cache: bool = False):
    from dmlrepro.data import ManifestDataset, build_transform, load

    tf = build_transform(train, size=32, resize=32, resize_mode="square", normalization="imagenet")
    manifest = load("digits", data_root)
    return ManifestDataset(manifest, indices=manifest.indices("train")[:300], transform=tf, cache_images=cache)


@pytest.mark.parametrize("workers", [0, 2])
def test_embedder_equals_a_plain_loop(data_root, workers):
    from dmlrepro.train.embedder import Embedder
    from dmlrepro.train.run_data import SeededDataset

    model = _model().eval()
    ds = _digits(data_root, train=False)
    emb = Embedder(model, torch.device("cpu"), batch_size=100, num_workers=workers)
    with torch.no_grad():
        ref = torch.cat(
            [model(torch.stack([ds[i][0] for i in range(s, min(s + 100, len(ds)))])) for s in range(0, len(ds), 100)]
        )
    for _ in range(2):  # a second pass reuses the persistent loader
        got, labels, rows = emb.embed(ds)
        assert np.array_equal(got, ref.numpy()) and np.array_equal(labels, ds.labels)
        assert np.array_equal(rows, ds.rows)
    # a pool: item k of `indices` under the seed base + k, train augmentation (ASAP's pools)
    aug = _digits(data_root, train=True)
    idx = torch.tensor([5, 3, 200, 7, 5, 11] * 40)
    items = SeededDataset(aug)
    with torch.no_grad():
        xs = torch.stack([items[(int(i), 1000 + k)][0] for k, i in enumerate(idx)])
        ref = torch.cat([model(xs[s : s + 100]) for s in range(0, len(xs), 100)])
    assert torch.equal(emb.embed_seeded(aug, idx, 1000), ref)
    emb.close()


def test_embedder_stops_on_the_flag(data_root):
    from dmlrepro.train.embedder import Embedder, EmbeddingInterrupted

    class Flag:
        signum = None

        def __bool__(self):
            return self.signum is not None

    flag = Flag()
    emb = Embedder(_model(), torch.device("cpu"), batch_size=64, stop=flag)
    ds = _digits(data_root, train=False)
    emb.embed(ds)
    flag.signum = signal.SIGTERM
    with pytest.raises(EmbeddingInterrupted):
        emb.embed(ds)


# -- the shared image cache -------------------------------------------------------------------------
def test_shared_cache_is_filled_by_workers_and_holds_the_decoded_bytes(data_root, monkeypatch):
    from dmlrepro.data.dataset import load_image
    from dmlrepro.train import imagecache
    from dmlrepro.train.imagecache import share_image_cache
    from dmlrepro.train.run_data import SeededDataset

    monkeypatch.setattr(imagecache, "read_decoded", lambda _root: {})  # as without images decoded at preparation
    ds, plain = _digits(data_root, train=True, cache=True), _digits(data_root, train=True)
    cache = share_image_cache([ds], budget_mb=64, say=lambda _m: None)
    assert cache is not None and not int(cache.filled.sum())
    loader = torch.utils.data.DataLoader(
        SeededDataset(ds), batch_size=None, num_workers=2, sampler=[(i, 7 + i) for i in range(len(ds))]
    )
    got = [x for x, _, _ in loader]
    assert int(cache.filled.sum()) == len(ds)  # written by the workers, seen here
    for i in (0, 17, len(ds) - 1):
        assert torch.equal(ds._cache[i], load_image(os.path.join(ds.root, ds.paths[i])))
    items = SeededDataset(plain)
    assert all(torch.equal(got[i], items[(i, 7 + i)][0]) for i in range(0, len(ds), 37))
    too_big = _digits(data_root, train=True, cache=True)
    assert share_image_cache([too_big], budget_mb=0.01, say=lambda _m: None) is None
    assert isinstance(too_big._cache, dict)


# -- runs: loaders, cache, interrupts and the policy change no number -------------------------------------------
def _final(out):
    return read_checkpoint(list_checkpoints(out / "checkpoints")[-1])


def _assert_same_run(ref, out):
    a, b = _final(ref), _final(out)
    assert a["position"]["epoch"] == b["position"]["epoch"] and b["position"]["batch"] == 0
    for part in ("model", "loss"):
        assert not state_differences(a[part], b[part]), part
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (ref, out))
    assert ma["metrics"] == mb["metrics"] and ma["status"] == mb["status"] == "completed"
    la, lb = (np.load(d / "embeddings_test.npz")["embeddings"] for d in (ref, out))
    assert np.array_equal(la, lb)


def _signal_on_call(monkeypatch, method: str, n: int) -> list:
    """SIGTERM this process at the n-th call of Embedder.<method> (before it embeds)."""
    from dmlrepro.train.embedder import Embedder

    calls, orig = [], getattr(Embedder, method)

    def wrapped(self, *a, **k):
        calls.append(1)
        if len(calls) == n:
            os.kill(os.getpid(), signal.SIGTERM)
        return orig(self, *a, **k)

    monkeypatch.setattr(Embedder, method, wrapped)
    return calls


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_root):
    from .conftest import tiny_config

    out = tmp_path_factory.mktemp("loaders") / "ref"
    assert train_run(tiny_config(data_root, dataset__hflip=0.5), out, progress=False)["status"] == "completed"
    return out


@pytest.mark.slow
def test_workers_cache_and_a_signal_during_evaluation_resume_bit_identical(reference, data_root, tmp_path, monkeypatch):
    """Persistent workers + the shared cache, SIGTERM during epoch 2's test evaluation: exit with
    a checkpoint at the end of epoch 2's training; the resumed run equals the reference."""
    from .conftest import tiny_config

    cfg = tiny_config(data_root, dataset__hflip=0.5, dataset__cache_images=True, num_workers=2, checkpoint={"keep": 10})
    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        _signal_on_call(mp, "embed", 3)  # epoch 0, epoch 1, then epoch 2's test split
        with pytest.raises(RunInterrupted):
            train_run(cfg, out, progress=False)
    assert list_checkpoints(out / "checkpoints")[-1].name == checkpoint_name(2, 4)  # epoch 2, after its 4 steps
    assert not (out / "metrics.json").exists()
    train_run(cfg, out, progress=False)
    _assert_same_run(reference, out)


@pytest.mark.slow
def test_checkpoint_overhead_zero_writes_only_the_last(reference, data_root, tmp_path):
    from .conftest import tiny_config

    out = tmp_path / "run"
    train_run(
        tiny_config(data_root, dataset__hflip=0.5, speed={"checkpoint_overhead": 0}, checkpoint={"keep": 10}),
        out,
        progress=False,
    )
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [checkpoint_name(4, 0)]
    _assert_same_run(reference, out)


@pytest.mark.slow
def test_signal_during_an_asap_pool_embedding_resumes_bit_identical(synth_root, tmp_path, monkeypatch):
    """SIGTERM while the first alternation embeds its k-Center pool (through the loader, 2
    workers): exit 75 with the state before that epoch's validation; the resumed run's weights,
    picks and validation log equal an uninterrupted run's."""
    from .test_validation_asap import asap_config

    ref, out = tmp_path / "ref", tmp_path / "run"
    cfg = asap_config(synth_root, epochs=8)
    train_run(cfg, ref, progress=False)
    log = json.loads((ref / "validation_log.json").read_text())
    assert log["alternations"], "the reference run must alternate"
    from dmlrepro.train.embedder import Embedder

    validated, orig = [], Embedder.embed_seeded

    def pool(self, *a, **k):  # the first pool after a validation (the first proxies' come before any)
        if validated:
            os.kill(os.getpid(), signal.SIGTERM)
        return orig(self, *a, **k)

    with monkeypatch.context() as mp:
        mp.setattr(Embedder, "embed_seeded", pool)
        mp.setattr(Embedder, "embed", lambda self, *a, _e=Embedder.embed, **k: validated.append(1) or _e(self, *a, **k))
        with pytest.raises(RunInterrupted):
            train_run({**cfg, "num_workers": 2}, out, progress=False)
    assert list_checkpoints(out / "checkpoints")[-1].name.endswith("-b000003.pt")  # end of an epoch's E = 3 steps
    train_run({**cfg, "num_workers": 2}, out, progress=False)
    a, b = _final(ref), _final(out)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["loss"]["proxies"], b["loss"]["proxies"])

    def strip(d):
        return (
            {k: strip(v) for k, v in d.items() if not k.endswith("seconds")}
            if isinstance(d, dict)
            else [strip(x) for x in d]
            if isinstance(d, list)
            else d
        )

    la, lb = (json.loads((d / "validation_log.json").read_text()) for d in (ref, out))
    assert strip(la) == strip(lb)


def _mixed_sizes(root):
    """A prepared dataset of 6 PNGs of three sizes (the real benchmarks' images differ in size)."""
    from PIL import Image

    from dmlrepro.data import ManifestDataset
    from dmlrepro.data.prepared import finalize, new_staging

    sizes = [(12, 20), (16, 16), (9, 14)] * 2  # (height, width)
    staging = new_staging(root / "mixed")
    paths = []
    for k, (h, w) in enumerate(sizes):
        paths.append(f"images/{k}.png")
        (staging / "images").mkdir(exist_ok=True)
        pixels = np.random.default_rng(k).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(staging / paths[-1])
    finalize(root / "mixed", staging, paths, [k % 3 for k in range(6)], ["train"] * 6)
    return ManifestDataset(root / "mixed", cache_images=True), sizes


def test_shared_cache_takes_the_sizes_recorded_at_preparation(tmp_path, monkeypatch):
    """Start-up opens no image when the sizes are recorded; the slots have the decoded shapes and
    the cache returns the decoder's bytes."""
    from dmlrepro.data.dataset import load_image
    from dmlrepro.data.prepared import SIZES_NAME, unprepare
    from dmlrepro.train import imagecache

    ds, sizes = _mixed_sizes(tmp_path)
    plain = [load_image(os.path.join(ds.root, p)) for p in ds.paths]

    def no_header(path):
        raise AssertionError(f"header of {path} read")

    monkeypatch.setattr(imagecache, "_header_shape", no_header)
    cache = imagecache.share_image_cache([ds], budget_mb=64, say=lambda _m: None)
    assert cache.shapes == sizes and cache.nbytes == sum(3 * h * w for h, w in sizes)
    for i in range(len(ds)):
        ds[i]
        assert torch.equal(ds._cache[i], plain[i]) and i not in ds._cache.own
    assert int(cache.filled.sum()) == len(ds)
    unprepare(tmp_path / "mixed")  # the record goes with its manifest
    assert not (tmp_path / "mixed" / SIZES_NAME).exists()


def test_shared_cache_starts_from_the_images_decoded_at_preparation(tmp_path, monkeypatch):
    """A small dataset's store (dmlrepro.data.decoded): every slot filled at start-up with the decoder's
    bytes, no image decoded during the run; a stored image whose shape disagrees with its slot is not used."""
    from dmlrepro.data import dataset
    from dmlrepro.data.decoded import DECODED_NAME, read_decoded
    from dmlrepro.data.prepared import unprepare
    from dmlrepro.train import imagecache

    ds, sizes = _mixed_sizes(tmp_path)
    plain = [dataset.load_image(os.path.join(ds.root, p)) for p in ds.paths]
    assert set(read_decoded(ds.root)) == set(ds.paths)
    monkeypatch.setattr(dataset, "load_image", lambda path: (_ for _ in ()).throw(AssertionError(f"{path} decoded")))
    cache = imagecache.share_image_cache([ds], budget_mb=64, say=lambda _m: None)
    assert int(cache.filled.sum()) == len(ds)
    assert all(torch.equal(ds._image(i), plain[i]) for i in range(len(ds)))
    stored = read_decoded(ds.root)
    monkeypatch.setattr(
        imagecache, "read_decoded", lambda _root: {**stored, ds.paths[0]: stored[ds.paths[0]].reshape(3, 20, 12)}
    )
    fresh = dataset.ManifestDataset(ds.root, cache_images=True)
    again = imagecache.share_image_cache([fresh], budget_mb=64, say=lambda _m: None)
    assert not again.filled[0] and int(again.filled.sum()) == len(ds) - 1
    unprepare(tmp_path / "mixed")  # the store goes with its manifest
    assert not (tmp_path / "mixed" / DECODED_NAME).exists()


def test_without_recorded_sizes_headers_are_read_until_the_budget_is_spent(tmp_path, monkeypatch):
    from dmlrepro.data import ManifestDataset
    from dmlrepro.data.prepared import SIZES_NAME
    from dmlrepro.train import imagecache

    ds, sizes = _mixed_sizes(tmp_path)
    (tmp_path / "mixed" / SIZES_NAME).unlink()  # a dataset prepared before the sizes were recorded
    read = []
    header = imagecache._header_shape
    monkeypatch.setattr(imagecache, "_header_shape", lambda path: read.append(path) or header(path))
    assert imagecache.share_image_cache([ds], budget_mb=64, say=lambda _m: None).shapes == sizes
    assert len(read) == len(ds)
    read.clear()
    fresh = ManifestDataset(ds.root, cache_images=True)
    budget_mb = sum(3 * h * w for h, w in sizes[:2]) / 2**20  # holds the first two images
    assert imagecache.share_image_cache([fresh], budget_mb=budget_mb, say=lambda _m: None) is None
    assert len(read) == 3 and isinstance(fresh._cache, dict)


def test_a_wrong_recorded_size_keeps_that_image_in_its_process(tmp_path):
    from dmlrepro.data.dataset import load_image
    from dmlrepro.data.prepared import SIZES_NAME
    from dmlrepro.train import imagecache

    ds, sizes = _mixed_sizes(tmp_path)
    record = tmp_path / "mixed" / SIZES_NAME
    record.write_text(record.read_text().replace("images/0.png,12,20", "images/0.png,20,12"))
    cache = imagecache.share_image_cache([ds], budget_mb=64, say=lambda _m: None)
    assert cache.shapes[0] == (20, 12)
    ds[0], ds[1]
    assert 0 in ds._cache.own and not cache.filled[0] and cache.filled[1]
    assert torch.equal(ds._cache[0], load_image(os.path.join(ds.root, ds.paths[0])))
