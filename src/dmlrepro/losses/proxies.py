"""A loss's proxies as its declaration (:class:`.registry.Proxies`) says where they are.

Used by the proxy–data measures of PFML Table 3 (W₂) and RSW Table III (AvgDTP), by
final_proxies.npz (the report's 2-d figure) and by sample-based ASAP. Each loss declares the space
its distances put the proxies in: PFML/CPML raw (normalised with `normalize_proxies`), RSW raw,
ASAP after its normalisation (v / max(1, ‖v‖), docs/readings/asap.md#asap-r31), the cosine losses
of PML (Proxy-Anchor, ProxyNCA, SoftTriple, normalised softmax, ArcFace, CosFace) and ProxyNCA as
published on the unit sphere (docs/readings/pfml.md#pfml-r24).
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import Proxies, spec_of


def declared_proxies(loss: nn.Module) -> Proxies:
    """The loss's proxy declaration; ValueError for a loss declared without proxies."""
    spec = spec_of(loss)
    if spec is None or spec.proxies is None:
        raise ValueError(f"loss {type(loss).__name__} has no proxies")
    return spec.proxies


def has_proxies(loss: nn.Module) -> bool:
    spec = spec_of(loss)
    return spec is not None and spec.proxies is not None


def proxy_points(loss: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, D) proxies in the loss's space and the (P,) class of each, detached; ValueError for a loss
    without proxies."""
    declared = declared_proxies(loss)
    with torch.no_grad():
        trained = declared.tensor(loss)
        points = declared.space(trained, loss)
        return points.detach().clone(), proxy_classes(len(trained), declared.per_class(loss), trained.device)


def trained_proxies(loss: nn.Module) -> tuple[torch.Tensor, int]:
    """The (P, D) proxies as trained (detached) and K, the proxies per class (row c·K + k is of class c)."""
    declared = declared_proxies(loss)
    return declared.tensor(loss).detach(), declared.per_class(loss)


def proxy_classes(count: int, per_class: int, device: torch.device | None = None) -> torch.Tensor:
    """The class of each of `count` proxies laid out class by class, `per_class` each."""
    return torch.div(torch.arange(count, device=device), max(per_class, 1), rounding_mode="floor")


def use_sample_proxies(loss: nn.Module) -> None:
    """Sample-based ASAP (eq. 4.10): the loss's proxies become a record of embedded samples."""
    declared = declared_proxies(loss)
    if declared.use_samples is None:
        raise ValueError(f"loss {type(loss).__name__}: its proxies cannot be replaced by samples")
    declared.use_samples(loss)
