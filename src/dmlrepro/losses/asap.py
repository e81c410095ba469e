"""ASAP DML's losses: a pair loss of :mod:`.pair_bases` on proxy–sample pairs (ASAP, eq. 4.11, Alg. 1)
and on batch×batch pairs (the plain baselines, the `Loss` rows of the paper's tables).

Vectors are first mapped by 𝒩(v) = v / max(1, ‖v‖) (paper §4.4; :mod:`dmlrepro.asap.normalisation`).
ASAP pairs the batch samples with all C·P proxies; the baselines pair the batch with itself,
self-pairs excluded.

Readings (defaults = docs/readings/asap.md):

* ASAP-R2 ``batch_pair_weight=0.0`` (ASAPLoss): weight of the in-batch sample–sample term added to the proxy
  term (paper Alg. 1: proxies only; later code 0.1). ``proxy_weight=1.0``.
* ASAP-R9 ``anchor="sample"`` (ASAPLoss): batch samples are anchors, proxies references (``"proxy"``: reversed).
* ASAP-R31 ``normalize="lipschitz"``: 𝒩 on embeddings and proxies (``"l2"``, ``"none"`` for ablations).

Like the other proxy losses, both compute with autocast off, in float32 at least (:mod:`.base`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..asap.normalisation import MODES, normalize
from .base import check_embeddings, full_precision
from .pair_bases import BASES, build_pair_base
from .registry import Paper, Proxies, register_loss

# Sec. 4.4 (ASAP-R35): GAP only, FC 1024->128 without bias, Glorot-uniform; its Lipschitz normalisation is
# part of the loss/evaluation, not of the model.
ASAP = Paper(
    "asap",
    "ASAP DML: Deep Metric Learning with Alternating Sets of Alternating Proxies",
    readings="asap.md",
    preset={"pool": "avg", "head": "linear", "head_bias": False, "head_init": "glorot_uniform", "l2_normalize": False},
)


class PairLoss(nn.Module):
    """A base loss on batch×batch pairs, self-pairs excluded (the `Loss` rows of the tables).

    `forward(embeddings, labels)` → scalar. No learnable parameters. `embedding_size`, when given,
    is checked against the embeddings' width.
    """

    def __init__(self, base_loss: str, normalize: str = "lipschitz", embedding_size: int | None = None, **hparams):
        super().__init__()
        if normalize not in MODES:
            raise ValueError(f"PairLoss: normalize must be one of {MODES}, got {normalize!r}")
        self.base_name, self.normalize, self.embedding_size = base_loss, normalize, embedding_size
        self.base = build_pair_base(base_loss, hparams)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_embeddings(self, embeddings, self.embedding_size)
        with full_precision(embeddings) as dtype:
            e = normalize(embeddings.to(dtype), self.normalize)
            return self.base(e, labels, e, labels, exclude_self=True)


class ASAPLoss(nn.Module):
    """A base loss on the pairs (batch sample, proxy) for all C·P proxies (eq. 4.11, Alg. 1).

    `.proxies` is an ``nn.Parameter`` (C·P, D); row c·P + k is proxy k of class c. The engine sets
    them with :meth:`set_proxies` (k-Center picks) at every alternation. The proximal term is not
    part of this loss (see :mod:`dmlrepro.asap.proximal`).

    Args:
        base_loss: "c1" | "c2" | "ms" | "triplet"; remaining keyword arguments go to the base loss.
        proxies_per_class: P (8 CUB/Cars, 4 SOP/InShop; 1 for ASAP-S).
        anchor: ASAP-R9, "sample" (default) or "proxy".
        batch_pair_weight, proxy_weight: ASAP-R2,
            loss = proxy_weight·L(batch, proxies) + batch_pair_weight·L(batch, batch).
        normalize: "lipschitz" (paper), "l2" or "none"; applied to embeddings and proxies.
        proxy_init_std: std of the Gaussian placeholder init (overwritten by k-Center before training).
    """

    def __init__(
        self,
        base_loss: str,
        num_classes: int,
        embedding_size: int,
        proxies_per_class: int = 8,
        anchor: str = "sample",
        batch_pair_weight: float = 0.0,
        proxy_weight: float = 1.0,
        normalize: str = "lipschitz",
        proxy_init_std: float = 0.1,
        **hparams,
    ):
        super().__init__()
        if anchor not in ("sample", "proxy"):
            raise ValueError(f"ASAPLoss: anchor must be 'sample' or 'proxy', got {anchor!r}")
        if normalize not in MODES:
            raise ValueError(f"ASAPLoss: normalize must be one of {MODES}, got {normalize!r}")
        if num_classes < 1 or proxies_per_class < 1 or embedding_size < 1:
            raise ValueError(
                f"ASAPLoss: need num_classes, proxies_per_class, embedding_size >= 1, got "
                f"{num_classes}, {proxies_per_class}, {embedding_size}"
            )
        self.base_name, self.base = base_loss, build_pair_base(base_loss, hparams)
        self.num_classes, self.embedding_size, self.proxies_per_class = num_classes, embedding_size, proxies_per_class
        self.anchor, self.batch_pair_weight, self.proxy_weight, self.normalize = (
            anchor,
            batch_pair_weight,
            proxy_weight,
            normalize,
        )
        self.proxies = nn.Parameter(torch.randn(num_classes * proxies_per_class, embedding_size) * proxy_init_std)
        self.register_buffer(
            "proxy_labels", torch.arange(num_classes).repeat_interleave(proxies_per_class), persistent=False
        )

    @torch.no_grad()
    def set_proxies(self, proxies: torch.Tensor) -> None:
        """Overwrite the proxies in place with (C, P, D) or (C·P, D) values (the k-Center picks)."""
        self.proxies.copy_(proxies.reshape(self.proxies.shape).to(self.proxies))

    @property
    def sample_based(self) -> bool:
        """True after :meth:`use_sample_proxies` (sample-based ASAP, eq. 4.10)."""
        return not isinstance(self.proxies, nn.Parameter)

    def use_sample_proxies(self) -> None:
        """Sample-based ASAP (eq. 4.10): the proxies stop being parameters.

        ``.proxies`` becomes a (persistent) buffer with the same values and state-dict key, so the
        loss has no trainable parameter; the engine passes the current network's embeddings of the
        k-Center-selected samples to :meth:`forward` as ``proxies`` at every step and stores their
        detached values here (a record for checkpoints, ``proxy_points`` and the report)."""
        if self.sample_based:
            return
        values = self.proxies.detach().clone()
        del self.proxies
        self.register_buffer("proxies", values)

    def forward(
        self, embeddings: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`proxies` (C·P, D), when given, replace ``self.proxies`` for this call (sample-based ASAP:
        the embeddings of the selected samples under the current θ; gradients flow into them)."""
        check_embeddings(self, embeddings, self.embedding_size)
        if proxies is None:
            proxies = self.proxies
        elif proxies.shape != self.proxies.shape:
            raise ValueError(f"ASAPLoss: proxies of shape {tuple(proxies.shape)}, expected {tuple(self.proxies.shape)}")
        with full_precision(embeddings) as dtype:
            e = normalize(embeddings.to(dtype), self.normalize)
            r = normalize(proxies, self.normalize).to(e.dtype)
            r_lab = self.proxy_labels.to(labels.device)
            if self.anchor == "sample":
                loss = self.proxy_weight * self.base(e, labels, r, r_lab)
            else:
                loss = self.proxy_weight * self.base(r, r_lab, e, labels)
            if self.batch_pair_weight:
                loss = loss + self.batch_pair_weight * self.base(e, labels, e, labels, exclude_self=True)
            return loss


def _asap(base):
    def build(num_classes: int, embedding_size: int, **hparams) -> ASAPLoss:
        return ASAPLoss(base, num_classes, embedding_size, **hparams)

    return build


def _pair(base):
    def build(num_classes: int, embedding_size: int, **hparams) -> PairLoss:
        return PairLoss(base, embedding_size=embedding_size, **hparams)

    return build


#: ASAP's proxies, P per class, in the space its pairs live in: 𝒩(ρ) (v / max(1, ‖v‖) by default); set by the
#: alternation (k-Center picks), embedded samples in sample-based ASAP (eq. 4.10)
ASAP_PROXIES = Proxies(
    tensor=lambda loss: loss.proxies,
    per_class=lambda loss: loss.proxies_per_class,
    space=lambda points, loss: normalize(points, loss.normalize),
    set=ASAPLoss.set_proxies,
    use_samples=ASAPLoss.use_sample_proxies,
)

#: ``asap_{c1,c2,ms,triplet}`` (proxy pairs) and ``pair_{c1,c2,ms,triplet}`` (batch pairs, the plain
#: baselines) -> builder(num_classes, embedding_size, **hparams), each registered
ASAP_LOSSES = {
    **{f"asap_{b}": register_loss(f"asap_{b}", paper=ASAP, proxies=ASAP_PROXIES, build=_asap(b)) for b in BASES},
    **{f"pair_{b}": register_loss(f"pair_{b}", paper=ASAP, build=_pair(b)) for b in BASES},
}

__all__ = ["ASAP", "ASAPLoss", "ASAP_LOSSES", "ASAP_PROXIES", "PairLoss"]
