"""Where a proxy loss keeps its proxies, as points of the space its distances live in.

Used by the proxy–data measures of PFML Table 3 (W₂) and RSW Table III (AvgDTP): PFML/CPML use
their proxies raw (normalised with `normalize_proxies`), RSW raw, ASAP after its normalisation
(v / max(1, ‖v‖), docs/readings/asap.md#asap-r31); the cosine losses of PML
(Proxy-Anchor, ProxyNCA, SoftTriple, normalised softmax, ArcFace, CosFace) on the unit sphere
(docs/readings/pfml.md#pfml-r24).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from ..asap.normalisation import normalize
from .asap import ASAPLoss
from .potential_field import PotentialFieldLoss
from .rsw import RSWLoss


def proxy_points(loss: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(P, D) proxies and the (P,) class of each, detached; ValueError for a loss without proxies."""
    with torch.no_grad():
        if isinstance(loss, PotentialFieldLoss):
            points = F.normalize(loss.proxies, dim=-1) if loss.normalize_proxies else loss.proxies
            return points.detach().clone(), loss.proxy_labels.clone()
        if isinstance(loss, ASAPLoss):  # in the space its pairs live in: 𝒩(ρ) (v / max(1, ‖v‖) by default)
            return normalize(loss.proxies, loss.normalize).detach().clone(), loss.proxy_labels.clone()
        if isinstance(loss, RSWLoss):
            return loss.proxies.detach().clone(), torch.arange(loss.num_classes, device=loss.proxies.device)
        # deferred heavy import on purpose: PML's classes are looked up, not imported (a loss can only be one
        # of them once PML is loaded; importing it here would load scipy.stats in every job)
        pml = sys.modules.get("pytorch_metric_learning.losses")
        if pml is None:
            raise ValueError(f"loss {type(loss).__name__} has no proxies")
        if isinstance(loss, (pml.ProxyAnchorLoss, pml.ProxyNCALoss)):
            points, per_class = loss.proxies, 1
        elif isinstance(loss, pml.SoftTripleLoss):  # column c·K + k of fc is centre k of class c
            points, per_class = loss.fc.t(), loss.centers_per_class
        elif isinstance(loss, (pml.NormalizedSoftmaxLoss, pml.ArcFaceLoss, pml.CosFaceLoss)):
            points, per_class = loss.W.t(), 1
        else:
            raise ValueError(f"loss {type(loss).__name__} has no proxies")
        labels = torch.arange(points.shape[0] // per_class, device=points.device).repeat_interleave(per_class)
        return F.normalize(points, dim=-1).detach().clone(), labels
