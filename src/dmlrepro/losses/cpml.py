"""CPML: the contrastive-potential baseline the PFML paper defines (main §3.4.2, supp. §1;
docs/readings/pfml.md#pfml-r8).

Same energy, proxies and δ as PFML, with the distance-proportional potentials of the contrastive
loss (supp. eq. 2/4): ψ*_att(d) = max(d, δ_att)², whose force grows with distance. ψ*_rep is never
defined by the paper; two readings (docs/readings/pfml.md#pfml-r8):

* ``"mirror"`` (default): ψ*_rep(d) = −min(d, δ_rep)², PFML's eq. (2) with d^−α → d²;
* ``"hinge"``: ψ*_rep(d) = max(0, δ_rep − d)², the textbook contrastive repulsion with margin δ.
"""

from __future__ import annotations

from .pfml import PFML
from .potential_field import POTENTIAL_FIELD_PROXIES, PotentialFieldLoss
from .registry import register_loss

REPULSIONS = ("mirror", "hinge")


@register_loss("cpml", paper=PFML, proxies=POTENTIAL_FIELD_PROXIES, config_defaults={"proxies_per_class": 2})
class CPMLLoss(PotentialFieldLoss):
    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        proxies_per_class: int,
        delta: float = 0.2,
        delta_rep: float | None = None,
        reduction: str = "sum",
        repulsion: str = "mirror",
        **kwargs,
    ):
        super().__init__(num_classes, embedding_size, proxies_per_class, delta, delta_rep, reduction, **kwargs)
        if repulsion not in REPULSIONS:
            raise ValueError(f"CPMLLoss: repulsion must be one of {REPULSIONS}, got {repulsion!r}")
        self.repulsion_form = repulsion

    def attraction(self, d):
        return d.clamp_min(self.delta_att).pow(2)

    def repulsion(self, d):
        if self.repulsion_form == "mirror":
            return -d.clamp_max(self.delta_rep).pow(2)
        return (self.delta_rep - d).clamp_min(0.0).pow(2)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, repulsion={self.repulsion_form!r}"
