"""Weight cache: fetch (download + verify + atomic rename), cache-only load, CLI."""

from __future__ import annotations

import hashlib
import shlex

import pytest
import torch
import torchvision

from dmlrepro.models import (
    ChecksumMismatchError,
    WeightsError,
    WeightsNotCachedError,
    build_model,
    default_cache_dir,
    fetch_weights,
    get_weight_spec,
    load_pretrained,
)
from dmlrepro.models.cli import main as cli_main


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tv_resnet18_file(http_files, randomize):
    """A random torchvision resnet18 state dict (with its fc) served under the upstream file name."""
    serve_dir, base_url = http_files
    spec = get_weight_spec("resnet18.tv_in1k")
    state = randomize(torchvision.models.resnet18()).state_dict()
    path = serve_dir / spec.filename
    torch.save(state, path)
    return spec, state, path, f"{base_url}/{spec.filename}"


def test_success_loads_exactly_the_saved_weights(tmp_path, tv_resnet18_file):
    spec, state, path, url = tv_resnet18_file
    cache = tmp_path / "cache"
    digest = _sha(path)
    assert fetch_weights(spec.name, cache, url=url, sha256=digest) == cache / spec.filename
    assert _sha(cache / spec.filename) == digest

    model = build_model(
        backbone="resnet18",
        embedding_size=32,
        pretrained=True,
        weights_cache_dir=cache,
        weights_sha256=digest,
    )
    loaded = model.backbone.state_dict()
    trunk_keys = [k for k in state if not k.startswith("fc.")]
    assert sorted(loaded) == sorted(trunk_keys)  # torchvision keys == timm keys minus fc
    for key in trunk_keys:
        assert torch.equal(loaded[key], state[key]), key
    # and the loaded trunk computes what torchvision's resnet18 computes with these weights
    tv = torchvision.models.resnet18()
    tv.load_state_dict(state)
    tv.fc = torch.nn.Identity()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(model.eval().forward_pooled(x), tv.eval()(x), atol=1e-4, rtol=1e-4)


def test_hash_prefix_verification(tmp_path, tv_resnet18_file):
    spec, _, path, url = tv_resnet18_file
    digest = _sha(path)
    fetch_weights(spec.name, tmp_path / "a", url=url, sha256=digest[:8])
    wrong_prefix = ("0" if digest[0] != "0" else "1") + digest[1:8]
    with pytest.raises(ChecksumMismatchError):
        fetch_weights(spec.name, tmp_path / "b", url=url, sha256=wrong_prefix)


def test_wrong_checksum_raises_and_leaves_no_file(tmp_path, tv_resnet18_file, files_in):
    spec, _, path, url = tv_resnet18_file
    cache = tmp_path / "cache"
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ChecksumMismatchError, match="sha256 mismatch") as info:
        fetch_weights(spec.name, cache, url=url, sha256=wrong)
    assert wrong in str(info.value) and _sha(path) in str(info.value)
    assert files_in(cache) == []  # neither the file, nor a temp file, nor a .sha256
    # and the registry's own prefix (f37072fd) rejects a random file as well
    with pytest.raises(ChecksumMismatchError):
        fetch_weights(spec.name, cache, url=url)
    assert files_in(cache) == []


def test_missing_file_names_the_fetch_command(tmp_path):
    cache = tmp_path / "no such dir"
    model = build_model(backbone="resnet18", embedding_size=8)
    with pytest.raises(WeightsNotCachedError) as info:
        load_pretrained(model, "resnet18.tv_in1k", cache)
    command = f"dmlrepro fetch-weights resnet18.tv_in1k --cache-dir {shlex.quote(str(cache))}"
    assert command in str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    # build_model(pretrained=True) goes through the same path
    with pytest.raises(WeightsNotCachedError, match="dmlrepro fetch-weights resnet18.tv_in1k"):
        build_model(backbone="resnet18", pretrained=True, weights_cache_dir=cache)


def test_corrupted_cache_file_is_refused_at_load(tmp_path, tv_resnet18_file):
    spec, _, path, url = tv_resnet18_file
    cache = tmp_path / "cache"
    digest = _sha(path)
    cached = fetch_weights(spec.name, cache, url=url, sha256=digest)
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cached.write_bytes(bytes(data))
    model = build_model(backbone="resnet18", embedding_size=8)
    with pytest.raises(ChecksumMismatchError, match="--force"):
        load_pretrained(model, spec.name, cache, sha256=digest)


def test_cached_file_is_not_downloaded_again(tmp_path, tv_resnet18_file):
    spec, _, path, url = tv_resnet18_file
    cache = tmp_path / "cache"
    digest = _sha(path)
    fetch_weights(spec.name, cache, url=url, sha256=digest)
    path.unlink()  # the server no longer has it: a second download would fail
    assert fetch_weights(spec.name, cache, url=url, sha256=digest) == cache / spec.filename
    with pytest.raises(OSError):  # proof that a download is attempted when forced
        fetch_weights(spec.name, cache, url=url, sha256=digest, force=True)
    assert _sha(cache / spec.filename) == digest  # the failed forced download left the file intact


def test_wrong_architecture_fails_loudly(tmp_path, tv_resnet18_file):
    spec, _, path, url = tv_resnet18_file
    cache = tmp_path / "cache"
    digest = _sha(path)
    fetch_weights(spec.name, cache, url=url, sha256=digest)
    other = build_model(backbone="resnet10t", embedding_size=8)
    with pytest.raises((WeightsError, RuntimeError)):
        load_pretrained(other, spec.name, cache, sha256=digest)


def test_unverified_entry_needs_explicit_consent_then_loads_timm_vit(tmp_path, http_files, randomize, capsys):
    import timm

    serve_dir, base_url = http_files
    spec = get_weight_spec("vit_small_patch16_224.augreg_in21k_ft_in1k")
    assert spec.sha256 is None and spec.sha256_prefix is None  # nothing confirmed for HF files
    from safetensors.torch import save_file

    # depth 2 instead of 12 keeps the test cheap; the key layout per block is the real one
    upstream = randomize(timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000, depth=2))
    state = {k: v.contiguous() for k, v in upstream.state_dict().items()}
    save_file(state, str(serve_dir / "model.safetensors"))
    url = f"{base_url}/model.safetensors"
    cache = tmp_path / "cache"

    with pytest.raises(WeightsError, match="--allow-unverified"):
        fetch_weights(spec.name, cache, url=url)
    assert not cache.exists() or not any(cache.iterdir())

    path = fetch_weights(spec.name, cache, url=url, allow_unverified=True)
    digest = _sha(serve_dir / "model.safetensors")
    assert digest in capsys.readouterr().err  # the digest is reported...
    assert (cache / (spec.filename + ".sha256")).read_text().split()[0] == digest  # ...and recorded
    # once cached, fetching again needs no flag: the recorded digest verifies the file
    assert fetch_weights(spec.name, cache, url=url) == path

    model = build_model(
        backbone="vit_small_patch16_224",
        embedding_size=384,
        l2_normalize=True,
        pretrained=True,
        weights_cache_dir=cache,
        backbone_kwargs={"depth": 2},
    )
    loaded = model.backbone.state_dict()
    assert not any(k.startswith("head.") for k in loaded)
    assert set(loaded) == {k for k in state if not k.startswith("head.")}
    for key in loaded:
        assert torch.equal(loaded[key], state[key]), key
    # the load re-verifies against the recorded digest
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatchError):
        load_pretrained(model, spec.name, cache)


def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DMLREPRO_WEIGHTS", str(tmp_path / "w"))
    assert default_cache_dir() == tmp_path / "w"
    monkeypatch.delenv("DMLREPRO_WEIGHTS")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "dmlrepro" / "weights"


def test_cli_fetch_success_and_failure(tmp_path, tv_resnet18_file, capsys, files_in):
    spec, _, path, url = tv_resnet18_file
    digest = _sha(path)
    bad = tmp_path / "bad"
    rc = cli_main(["fetch-weights", "resnet18", "--cache-dir", str(bad), "--url", url, "--sha256", "ab" * 32])
    assert rc == 1
    assert "sha256 mismatch" in capsys.readouterr().err
    assert not bad.exists() or files_in(bad) == []

    good = tmp_path / "good"
    rc = cli_main([spec.name, "--cache-dir", str(good), "--url", url, "--sha256", digest])
    assert rc == 0
    assert str(good / spec.filename) in capsys.readouterr().out
    assert _sha(good / spec.filename) == digest

    assert cli_main(["no_such_weights", "--cache-dir", str(good)]) == 1
    assert "unknown weights or backbone" in capsys.readouterr().err


def test_cli_list_names_every_weight(capsys):
    from dmlrepro.models import list_weights

    assert cli_main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in list_weights():
        assert name in out
    assert "bn_inception-52deb4733.pth" in out


def test_torchvision_resnet50_keys_map_onto_the_timm_trunk():
    # resnet50.tv_in1k is torchvision's resnet50-0676ba61.pth: same keys as timm's resnet50
    # except the classifier fc.*, which the adapter drops.
    spec = get_weight_spec("resnet50.tv_in1k")
    assert spec.url == "https://download.pytorch.org/models/resnet50-0676ba61.pth"
    assert spec.url == torchvision.models.ResNet50_Weights.IMAGENET1K_V1.url
    tv = {k: v.shape for k, v in torchvision.models.resnet50().state_dict().items()}
    ours = {k: v.shape for k, v in build_model(backbone="resnet50", embedding_size=0).backbone.state_dict().items()}
    assert {k for k in tv if not k.startswith("fc.")} == set(ours)
    assert all(tv[k] == ours[k] for k in ours)


def test_registry_is_consistent():
    from dmlrepro.models import BACKBONES, WEIGHTS, resolve_backbone_name

    for name, spec in BACKBONES.items():
        if spec.default_weights is not None:
            assert resolve_backbone_name(WEIGHTS[spec.default_weights].architecture) == name
    for spec in WEIGHTS.values():
        resolve_backbone_name(spec.architecture)
        if spec.sha256_prefix:  # torch.hub convention: <name>-<sha256 prefix>.<ext>
            assert spec.filename.rsplit(".", 1)[0].endswith("-" + spec.sha256_prefix)
            assert spec.url.endswith("/" + spec.filename)
