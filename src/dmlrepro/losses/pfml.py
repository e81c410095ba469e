"""PFML: Potential Field based Metric Learning (Bhatnagar & Ahuja, CVPR 2025).

Single-point potentials, eqs. (1)–(2) of the paper (closed forms; docs/readings/pfml.md#pfml-r1):

    ψ_att(d) = −max(d, δ_att)^−α        zero force inside δ_att, decaying force α/d^(α+1) outside
    ψ_rep(d) =  min(d, δ_rep)^−α        force inside δ_rep only, constant δ_rep^−α outside

α = 0 makes both constant (nothing trains); `alpha0_mode="linear"` (default) reads the paper's
non-decaying α = 0 point of Fig. 3c as a unit-magnitude force, ψ_att = max(d, δ_att) and
ψ_rep = −min(d, δ_rep); `"literal"` keeps the constant potentials (PFML-R1).
The repulsion is floored at `d_floor` so that it stays finite in fp32 (PFML-R7).
"""

from __future__ import annotations

from .potential_field import POTENTIAL_FIELD_PROXIES, PotentialFieldLoss
from .registry import Paper, register_loss

ALPHA0_MODES = ("linear", "literal")

# PFML main §4.1: new last linear layer, l2-normalised output; GAP for CNNs is the reading
# (PFML-R18; avg+max for the Proxy-Anchor variant); CLS for ViTs (PFML-R19).
PFML = Paper(
    "pfml",
    "Bhatnagar & Ahuja, Potential Field Based Deep Metric Learning, CVPR 2025",
    readings="pfml.md",
    preset={"pool": None, "head": "linear", "head_init": "kaiming_fan_out", "l2_normalize": True},
)


@register_loss("pfml", paper=PFML, proxies=POTENTIAL_FIELD_PROXIES, config_defaults={"proxies_per_class": 2})
class PFMLLoss(PotentialFieldLoss):
    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        proxies_per_class: int,
        delta: float = 0.2,
        alpha: float = 4.0,
        delta_rep: float | None = None,
        reduction: str = "sum",
        alpha0_mode: str = "linear",
        d_floor: float = 1e-4,
        **kwargs,
    ):
        super().__init__(num_classes, embedding_size, proxies_per_class, delta, delta_rep, reduction, **kwargs)
        if alpha < 0:
            raise ValueError(f"PFMLLoss: alpha must be >= 0, got {alpha}")
        if alpha0_mode not in ALPHA0_MODES:
            raise ValueError(f"PFMLLoss: alpha0_mode must be one of {ALPHA0_MODES}, got {alpha0_mode!r}")
        if not 0 < d_floor < self.delta_rep:
            raise ValueError(
                f"PFMLLoss: need 0 < d_floor < delta_rep, got d_floor={d_floor}, delta_rep={self.delta_rep}"
            )
        self.alpha, self.alpha0_mode, self.d_floor = float(alpha), alpha0_mode, float(d_floor)

    def attraction(self, d):
        if self.alpha > 0:
            return -d.clamp_min(self.delta_att).pow(-self.alpha)  # eq. (1)
        if self.alpha0_mode == "linear":
            return d.clamp_min(self.delta_att)
        return d * 0.0 - 1.0  # literal eq. (1) at α = 0: constant −1

    def repulsion(self, d):
        if self.alpha > 0:
            return d.clamp(self.d_floor, self.delta_rep).pow(-self.alpha)  # eq. (2)
        if self.alpha0_mode == "linear":
            return -d.clamp_max(self.delta_rep)
        return d * 0.0 + 1.0  # literal eq. (2) at α = 0: constant +1

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}, alpha0_mode={self.alpha0_mode!r}"
