"""RSW: Realigned Softmax Warping (DeMoor & Prevost, arXiv 2408.15656), Sec. III, eqs. 4–8;
readings: docs/readings/rsw.md.

Per sample, with unnormalised Euclidean distances t_ij = ‖e_i − p_j‖ to one proxy per class,

    L_i = log(1 + Σ_{j≠y_i} exp(s·[f1(t_{i,y_i}) − f2(t_ij)]))                       (eq. 8)

f2(t) = t and the warp of the ground-truth distance (eq. 7, Δ without gradient, Fig. 8's k):

    f1(t) = k1·t + k·sg[(1 − k1)·t]      if t < α        (forward value t when k = 1, slope k1)
          = k2·t + (1 − k2)·α            otherwise      (continuous at α, slope k2)

s is the code's "temp", which multiplies the distances (an inverse temperature); the batch loss is
the mean over samples (official code, Image-Retrieval/Model.py). `warp=False` is eq. 4 (f1 = t).
Table III / Fig. 9 compare other functions; `RSW_FUNCTIONS` names them (RSW-R13, RSW-R14):
V1–V4 use f1 = f2 = t^power; V5–V8 are eq. 7 with α = ∞ (k1 only, no Δ) or α = 0 (k2 only).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .base import check_embeddings, full_precision
from .distances import pairwise_distances
from .registry import Paper, Proxies, register_loss

# Sec. IV-B and the code's Model.py (RSW-R10): max + avg pooling summed, LayerNorm(C, no affine), Linear(C, 512),
# kaiming fan_out (CUB/Cars; "default" for SOP), no L2 normalisation.
RSW = Paper(
    "rsw",
    "DeMoor & Prevost, Realigned Softmax Warping for Deep Metric Learning, arXiv 2408.15656",
    readings="rsw.md",
    preset={"pool": "avg+max", "head": "layernorm_linear", "head_init": "kaiming_fan_out", "l2_normalize": False},
)

FUNCTIONS = ("warp", "power")

# Table III rows (RSW-R14). The half-warps V5/V6 print no Δ (AMBIGUOUS: `use_delta` switches it).
RSW_FUNCTIONS: dict[str, dict] = {
    "V1": {"function": "power", "power": 1.0},  # t1 − t2 = eq. 4
    "V2": {"function": "power", "power": 2.0},
    "V3": {"function": "power", "power": 0.5},
    "V4": {"function": "power", "power": 1.5},
    "V5": {"function": "warp", "alpha": math.inf, "k1": 0.97, "k2": 1.0, "use_delta": False},
    "V6": {"function": "warp", "alpha": math.inf, "k1": 0.5, "k2": 1.0, "use_delta": False},
    "V7": {"function": "warp", "alpha": 0.0, "k1": 1.0, "k2": 1.1},
    "V8": {"function": "warp", "alpha": 0.0, "k1": 1.0, "k2": 2.0},
    "W1": {"function": "warp", "alpha": 50.0, "k1": 0.5, "k2": 1.5},
    "W2": {"function": "warp", "alpha": 25.0, "k1": 0.9, "k2": 1.1},
    "W3": {"function": "warp", "alpha": 7.75, "k1": 0.25, "k2": 2.25},
}


@register_loss(
    "rsw",
    paper=RSW,
    proxies=Proxies(tensor=lambda loss: loss.proxies),  # one per class, Euclidean
    config_defaults={"alpha": 28.4, "k1": 0.93, "k2": 1.15},
)  # CUB phase 1 of the RSW code (RSW-R3)
class RSWLoss(nn.Module):
    """Eq. 8 with the eq. 7 warp; proxies `(num_classes, embedding_size)`, Kaiming-normal (fan_out) init.

    Args:
        alpha, k1, k2: eq. 7 (α may be `math.inf`: the first branch everywhere).
        scale: s, multiplies every (warped) distance before the softmax ("temp" in the code).
        delta_scale: k of Fig. 8, Δ = k·sg[(1 − k1)·t1] (the code's "margin"; 1 = eq. 7).
        warp: False gives eq. 4 (f1 = f2 = t).
        function: "warp" (eq. 7) or "power" (f1 = f2 = t^power, Table III V1–V4).
        use_delta: add Δ in the first branch of eq. 7 (False for the printed half-warps V5/V6).

    The loss parameters are plain attributes so that RSW's second ("followup") phase can change them.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        alpha: float,
        k1: float,
        k2: float,
        scale: float = 1.0,
        delta_scale: float = 1.0,
        warp: bool = True,
        function: str = "warp",
        power: float = 1.0,
        use_delta: bool = True,
    ):
        super().__init__()
        if function not in FUNCTIONS:
            raise ValueError(f"RSWLoss: function must be one of {FUNCTIONS}, got {function!r}")
        if k1 <= 0 or k2 <= 0 or alpha < 0 or scale <= 0 or power <= 0:
            raise ValueError(
                f"RSWLoss: need k1, k2, scale, power > 0 and alpha >= 0, got k1={k1}, k2={k2}, "
                f"alpha={alpha}, scale={scale}, power={power}"
            )
        self.num_classes, self.embedding_size = num_classes, embedding_size
        self.alpha, self.k1, self.k2, self.scale, self.delta_scale = alpha, k1, k2, scale, delta_scale
        self.warp, self.function, self.power, self.use_delta = warp, function, power, use_delta
        self.proxies = nn.Parameter(torch.empty(num_classes, embedding_size))
        nn.init.kaiming_normal_(self.proxies, mode="fan_out")

    def warp_ground_truth(self, t1: torch.Tensor) -> torch.Tensor:
        """f1 of eq. 7 (Fig. 8's k on Δ)."""
        inner = self.k1 * t1
        if self.use_delta:
            inner = inner + self.delta_scale * ((1.0 - self.k1) * t1).detach()
        if math.isinf(self.alpha):
            return inner
        outer = self.k2 * t1 + (1.0 - self.k2) * self.alpha
        return torch.where(t1.detach() < self.alpha, inner, outer)

    def warped_distances(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(B, C) matrix f2(t_ij), with f1(t_{i,y_i}) in each row's ground-truth column."""
        t = pairwise_distances(embeddings, self.proxies.to(embeddings.dtype))
        if not self.warp:
            return t
        if self.function == "power":
            return t.pow(self.power)
        gt = labels[:, None]
        return t.scatter(1, gt, self.warp_ground_truth(t.gather(1, gt)))

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_embeddings(self, embeddings, self.embedding_size)
        with full_precision(embeddings) as dtype:
            labels = labels.to(embeddings.device).long()
            logits = -self.scale * self.warped_distances(embeddings.to(dtype), labels)
            return F.cross_entropy(logits, labels)  # mean_i log(1 + Σ_{j≠y} exp(s(f1 − t_j)))

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, embedding_size={self.embedding_size}, alpha={self.alpha}, "
            f"k1={self.k1}, k2={self.k2}, scale={self.scale}, delta_scale={self.delta_scale}, "
            f"warp={self.warp}, function={self.function!r}"
        )
