"""Pretrained weights: a registry of upstream files, a fetch step and a cache-only loader.

Compute nodes often have no internet, so weights are fetched once by a separate step::

    dmlrepro fetch-weights NAME --cache-dir DIR

and training only ever reads the cache (:func:`load_pretrained`). Each cached file is the
file exactly as the upstream URL serves it (a torchvision ``.pth`` state dict, timm's hub
``model.safetensors``, Cadene's ``bn_inception-52deb4733.pth``); key mapping into our
modules happens at load time.

Checksums. Every registry entry records what is known about the file's sha256:

- ``sha256``: the full hex digest, only where it could be confirmed;
- ``sha256_prefix``: the hash prefix embedded in the upstream file name (torchvision and
  Cadene name files ``<arch>-<first hex digits of sha256>.pth``; ``torch.hub``'s
  ``check_hash`` verifies exactly this prefix).

Verification uses the full digest when there is one, else the prefix. Entries with neither
(timm's Hugging Face hub files) can only be fetched with an explicit ``sha256=`` or with
``allow_unverified=True``. Every fetch writes a ``<file>.sha256`` side file with the digest
it verified, and :func:`load_pretrained` re-checks the file against the expected value
(registry, override, or for unverified entries that side file) before loading.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from dmlrepro.atomic import atomic_open, atomic_write_text

__all__ = [
    "WeightSpec",
    "WEIGHTS",
    "WeightsError",
    "ChecksumMismatchError",
    "WeightsNotCachedError",
    "default_cache_dir",
    "get_weight_spec",
    "list_weights",
    "weight_path",
    "fetch_weights",
    "load_pretrained",
    "load_weights_file",
    "sha256_file",
    "fetch_command",
]

ENV_CACHE_DIR = "DMLREPRO_WEIGHTS"
_HF = "https://huggingface.co/{repo}/resolve/main/model.safetensors"


@dataclass(frozen=True)
class WeightSpec:
    """One upstream weight file.

    ``adapter`` names the key mapping applied at load time: ``"torchvision_resnet"``
    (torchvision ResNet state dict into a timm ResNet trunk: identical keys, ``fc.*``
    dropped), ``"timm"`` (timm state dict, classifier ``head.*`` dropped when the trunk has
    no classifier), ``"cadene_bninception"`` (leading singleton dims squeezed as Proxy-Anchor
    does, ``last_linear.*`` dropped when the trunk has no classifier).
    """

    name: str
    url: str
    filename: str
    file_format: str  # "torch" | "safetensors"
    adapter: str
    architecture: str  # backbone name this file fits
    sha256: str | None = None
    sha256_prefix: str | None = None
    sha256_unconfirmed: str | None = None  # a full digest seen somewhere, not relied upon
    source: str = ""  # where the URL was confirmed
    notes: str = ""

    @property
    def expected_hash(self) -> str | None:
        return self.sha256 or self.sha256_prefix


WEIGHTS: dict[str, WeightSpec] = {}


def _register(spec: WeightSpec) -> None:
    if spec.name in WEIGHTS:
        raise ValueError(f"weight name {spec.name!r} registered twice")
    WEIGHTS[spec.name] = spec


_TV = "torchvision 0.29 `ResNet*_Weights` enum and timm 1.0.31 pretrained_cfg `url`"
_register(
    WeightSpec(
        name="resnet50.tv_in1k",
        url="https://download.pytorch.org/models/resnet50-0676ba61.pth",
        filename="resnet50-0676ba61.pth",
        file_format="torch",
        adapter="torchvision_resnet",
        architecture="resnet50",
        sha256_prefix="0676ba61",
        source=_TV + " (IMAGENET1K_V1 = timm resnet50.tv_in1k)",
        notes="torchvision IMAGENET1K_V1 (what `resnet50(pretrained=True)` loads); RSW, PFML, Proxy-Anchor",
    )
)
_register(
    WeightSpec(
        name="resnet50.tv2_in1k",
        url="https://download.pytorch.org/models/resnet50-11ad3fa6.pth",
        filename="resnet50-11ad3fa6.pth",
        file_format="torch",
        adapter="torchvision_resnet",
        architecture="resnet50",
        sha256_prefix="11ad3fa6",
        source=_TV + " (IMAGENET1K_V2 = timm resnet50.tv2_in1k)",
        notes="torchvision IMAGENET1K_V2 (newer recipe); not used by the papers",
    )
)
_register(
    WeightSpec(
        name="resnet18.tv_in1k",
        url="https://download.pytorch.org/models/resnet18-f37072fd.pth",
        filename="resnet18-f37072fd.pth",
        file_format="torch",
        adapter="torchvision_resnet",
        architecture="resnet18",
        sha256_prefix="f37072fd",
        source=_TV + " (IMAGENET1K_V1 = timm resnet18.tv_in1k)",
    )
)
_register(
    WeightSpec(
        name="vit_small_patch16_224.augreg_in21k_ft_in1k",
        url=_HF.format(repo="timm/vit_small_patch16_224.augreg_in21k_ft_in1k"),
        filename="vit_small_patch16_224.augreg_in21k_ft_in1k.safetensors",
        file_format="safetensors",
        adapter="timm",
        architecture="vit_small_patch16_224",
        source="timm 1.0.31 pretrained_cfg hf_hub_id + huggingface_hub URL template",
        notes="ViT-S/16 AugReg, ImageNet-21k pre-trained, ImageNet-1k fine-tuned; input mean=std=0.5. "
        "sha256 not confirmed (no internet here): fetch with --sha256 from the Hugging Face file page "
        "or --allow-unverified",
    )
)
_register(
    WeightSpec(
        name="vit_small_patch16_224.augreg_in21k",
        url=_HF.format(repo="timm/vit_small_patch16_224.augreg_in21k"),
        filename="vit_small_patch16_224.augreg_in21k.safetensors",
        file_format="safetensors",
        adapter="timm",
        architecture="vit_small_patch16_224",
        source="timm 1.0.31 pretrained_cfg hf_hub_id + huggingface_hub URL template",
        notes="ViT-S/16 AugReg, ImageNet-21k only (21843-class head dropped); input mean=std=0.5. sha256 not confirmed",
    )
)
_register(
    WeightSpec(
        name="vit_small_patch16_224.dino",
        url=_HF.format(repo="timm/vit_small_patch16_224.dino"),
        filename="vit_small_patch16_224.dino.safetensors",
        file_format="safetensors",
        adapter="timm",
        architecture="dino_vits16",
        source="timm 1.0.31 pretrained_cfg hf_hub_id + huggingface_hub URL template "
        "(original: https://dl.fbaipublicfiles.com/dino/dino_deitsmall16_pretrain/dino_deitsmall16_pretrain.pth)",
        notes="DINO self-supervised ViT-S/16 (no classifier); ImageNet mean/std. sha256 not confirmed",
    )
)
_register(
    WeightSpec(
        name="bn_inception.imagenet",
        url="http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth",
        filename="bn_inception-52deb4733.pth",
        file_format="torch",
        adapter="cadene_bninception",
        architecture="bn_inception",
        sha256_prefix="52deb4733",
        sha256_unconfirmed="52deb473314542a5c2f87e9e6f26f4ca42fe863d15f986414dbae8c2dfdd2353",
        source="Proxy-Anchor code (net/bn_inception.py) and MS-loss README; Cadene's current "
        "pretrainedmodels points to bn_inception-239d2248.pth instead",
        notes="Caffe-ported ImageNet BN-Inception; BGR 0-255, mean [104,117,128]. URL liveness "
        "UNCONFIRMED; the full sha256 was seen in one third-party repository only, so the 9-hex "
        "file-name prefix is what is verified",
    )
)


# -- errors ----------------------------------------------------------------------------------
class WeightsError(RuntimeError):
    """Base class of the weight-cache errors."""


class ChecksumMismatchError(WeightsError):
    """A downloaded or cached file does not have the expected sha256."""


class WeightsNotCachedError(WeightsError, FileNotFoundError):
    """The requested weights are not in the cache; the message says how to fetch them."""


# -- registry helpers ------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """``$DMLREPRO_WEIGHTS`` if set, else ``~/.cache/dmlrepro/weights``."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "dmlrepro" / "weights"


def list_weights() -> list[str]:
    return sorted(WEIGHTS)


def get_weight_spec(name: str) -> WeightSpec:
    try:
        return WEIGHTS[name]
    except KeyError:
        raise KeyError(f"unknown pretrained weights {name!r}; known: {', '.join(list_weights())}") from None


def _cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def weight_path(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the file of weights ``name`` lives in the cache."""
    return _cache_dir(cache_dir) / get_weight_spec(name).filename


def fetch_command(name: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The shell command that puts weights ``name`` into ``cache_dir`` (for entries without a
    known checksum it needs ``--sha256 HEX`` or ``--allow-unverified`` in addition)."""
    cmd = f"dmlrepro fetch-weights {shlex.quote(name)} --cache-dir {shlex.quote(str(_cache_dir(cache_dir)))}"
    return cmd


# -- hashing ---------------------------------------------------------------------------------
def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def _normalise_hash(value: str, field_name: str) -> str:
    v = value.strip().lower()
    if len(v) < 8 or len(v) > 64 or any(c not in "0123456789abcdef" for c in v):
        raise ValueError(f"{field_name} must be 8 to 64 hex digits (a sha256 or its prefix), got {value!r}")
    return v


def _matches(digest: str, expected: str) -> bool:
    return digest.startswith(expected)  # a full digest is its own 64-char prefix


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _expected_hash(spec: WeightSpec, sha256: str | None) -> str | None:
    if sha256 is not None:
        return _normalise_hash(sha256, "sha256")
    return spec.expected_hash


# -- fetch -----------------------------------------------------------------------------------
def fetch_weights(
    name: str,
    cache_dir: str | os.PathLike | None = None,
    url: str | None = None,
    *,
    sha256: str | None = None,
    allow_unverified: bool = False,
    force: bool = False,
    timeout: float = 60.0,
    progress: bool | None = None,
) -> Path:
    """Download weights ``name`` into the cache (once) and return the cached path.

    The download goes to a temporary file in the cache directory; its sha256 is computed
    while streaming and checked against ``sha256`` (full digest or >= 8-hex prefix; default:
    the registry's value) *before* the file is renamed into place, so a bad download never
    leaves a file under the cached name. ``url`` overrides the registry URL (mirrors, tests).
    An already cached file that verifies is not downloaded again (``force=True`` re-downloads).
    """
    spec = get_weight_spec(name)
    expected = _expected_hash(spec, sha256)
    directory = _cache_dir(cache_dir)
    dest = directory / spec.filename
    if dest.exists() and not force and _cached_file_verifies(name, dest, expected, allow_unverified):
        return dest
    if expected is None and not allow_unverified:
        raise WeightsError(
            f"no sha256 is recorded for weights {name!r} ({spec.url}), so a download could not "
            "be verified. Pass the expected digest (`--sha256 HEX`, e.g. from the file page of "
            "the host) or accept an unverified download explicitly (`--allow-unverified`)."
        )

    directory.mkdir(parents=True, exist_ok=True)
    source = url or spec.url
    with atomic_open(dest, "wb") as out:  # a mismatch below raises inside: the cache stays untouched
        digest = _stream(source, out, spec.filename, timeout, progress)
        if expected is not None and not _matches(digest, expected):
            raise ChecksumMismatchError(
                f"sha256 mismatch for weights {name!r} downloaded from {source}: got {digest}, "
                f"expected {expected}{'...' if len(expected) < 64 else ''}. Nothing was written "
                f"to the cache ({dest})."
            )
        if expected is None:
            print(
                f"WARNING: weights {name!r} were downloaded WITHOUT verification; "
                f"sha256 = {digest} (recorded in {_sidecar(dest).name})",
                file=sys.stderr,
            )
    _write_sidecar(dest, digest)
    return dest


def _cached_file_verifies(name: str, dest: Path, expected: str | None, allow_unverified: bool) -> bool:
    """Whether the cached ``dest`` can be returned: its sha256 matches ``expected`` (or the digest recorded
    beside it), or there is none and unverified files are allowed. A mismatch raises: the cache never
    silently holds another file."""
    digest = sha256_file(dest)
    want = expected or _read_sidecar(dest)
    if want is not None and not _matches(digest, want):
        raise ChecksumMismatchError(
            f"cached file {dest} has sha256 {digest}, expected {want}. Delete it or re-run "
            f"with --force: {fetch_command(name, dest.parent)} --force"
        )
    if want is None and not allow_unverified:
        return False
    _write_sidecar(dest, digest)
    return True


def _stream(source: str, out, filename: str, timeout: float, progress: bool | None) -> str:
    """Download ``source`` into the open file ``out`` in 1 MiB chunks (a progress bar named ``filename``);
    the sha256 of what was written."""
    h = hashlib.sha256()
    req = urllib.request.Request(source, headers={"User-Agent": "dmlrepro-fetch-weights"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        bar = _progress_bar(resp.headers.get("Content-Length"), filename, progress)
        try:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                h.update(chunk)
                if bar is not None:
                    bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.close()
    return h.hexdigest()


def _progress_bar(total: str | None, desc: str, progress: bool | None):
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return None
    return tqdm(total=int(total) if total else None, unit="B", unit_scale=True, desc=desc)


def _write_sidecar(path: Path, digest: str) -> None:
    atomic_write_text(_sidecar(path), f"{digest}  {path.name}\n")


def _read_sidecar(path: Path) -> str | None:
    side = _sidecar(path)
    if not side.exists():
        return None
    return side.read_text().split()[0].strip().lower()


# -- load ------------------------------------------------------------------------------------
def load_weights_file(path: str | os.PathLike, file_format: str) -> dict[str, torch.Tensor]:
    """Read a state dict from a cached file (no code execution: ``weights_only``)."""
    if file_format == "safetensors":
        from safetensors.torch import load_file  # deferred: safetensors, only .safetensors files need it

        return dict(load_file(str(path), device="cpu"))
    if file_format == "torch":
        obj = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
            obj = obj["state_dict"]
        if not isinstance(obj, Mapping):
            raise WeightsError(f"{path} does not contain a state dict (got {type(obj).__name__})")
        return dict(obj)
    raise ValueError(f"unknown weight file format {file_format!r}")


def _trunk_of(model: nn.Module) -> nn.Module:
    return getattr(model, "backbone", model)


def _adapt(spec: WeightSpec, state: dict[str, torch.Tensor], trunk: nn.Module) -> dict[str, torch.Tensor]:
    own = trunk.state_dict()
    if spec.adapter == "torchvision_resnet":
        # torchvision and timm ResNets share every key; only the classifier differs.
        state = {k: v for k, v in state.items() if not (k.startswith("fc.") and k not in own)}
    elif spec.adapter == "timm":
        heads = ("head.", "head_dist.", "fc.", "classifier.")
        state = {k: v for k, v in state.items() if not (k.startswith(heads) and k not in own)}
    elif spec.adapter == "cadene_bninception":
        state = {k: v for k, v in state.items() if not (k.startswith("last_linear.") and k not in own)}
        # The Caffe-ported file stores some BatchNorm tensors as (1, C); Proxy-Anchor squeezes
        # them (`v.squeeze(0) if v.size(0) == 1`). Do that only where the shape requires it.
        for k, v in list(state.items()):
            if k in own and v.dim() > own[k].dim() and v.shape[0] == 1 and v.squeeze(0).shape == own[k].shape:
                state[k] = v.squeeze(0)
    else:
        raise ValueError(f"unknown adapter {spec.adapter!r}")
    return state


def load_pretrained(
    model: nn.Module,
    name: str,
    cache_dir: str | os.PathLike | None = None,
    *,
    sha256: str | None = None,
) -> nn.Module:
    """Load cached weights ``name`` into ``model`` (an ``EmbeddingModel`` or a bare trunk).

    Reads the cache only. A missing file raises :class:`WeightsNotCachedError` naming the
    command that fetches it; a file whose sha256 does not match raises
    :class:`ChecksumMismatchError`. Keys are mapped by the entry's adapter and loaded
    strictly into the trunk (``model.backbone`` when present), so a wrong architecture or a
    truncated file fails loudly. Returns ``model``.
    """
    spec = get_weight_spec(name)
    directory = _cache_dir(cache_dir)
    path = directory / spec.filename
    if not path.exists():
        raise WeightsNotCachedError(
            f"pretrained weights {name!r} are not in the cache: {path} does not exist. "
            f"Fetch them once, on a machine with internet access, with:\n    {fetch_command(name, directory)}"
            + (
                ""
                if spec.expected_hash
                else "\n(no checksum is recorded for these weights: add --sha256 HEX or --allow-unverified)"
            )
        )
    expected = _expected_hash(spec, sha256) or _read_sidecar(path)
    if expected is None:
        raise ChecksumMismatchError(
            f"cannot verify {path}: no sha256 is recorded for {name!r} and there is no "
            f"{_sidecar(path).name} next to it. Re-fetch it: {fetch_command(name, directory)} --force"
        )
    digest = sha256_file(path)
    if not _matches(digest, expected):
        raise ChecksumMismatchError(
            f"cached weights {path} have sha256 {digest}, expected {expected}"
            f"{'...' if len(expected) < 64 else ''}; the file is corrupt or not the expected "
            f"one. Re-fetch it: {fetch_command(name, directory)} --force"
        )
    trunk = _trunk_of(model)
    state = _adapt(spec, load_weights_file(path, spec.file_format), trunk)
    result = trunk.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("num_batches_tracked")]
    if missing or result.unexpected_keys:
        raise WeightsError(
            f"weights {name!r} ({path}) do not fit {type(trunk).__name__}: "
            f"missing keys {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected keys {result.unexpected_keys[:8]}"
            f"{'...' if len(result.unexpected_keys) > 8 else ''}"
        )
    return model
