"""The four pair losses ASAP wraps — C1, C2, MS, Triplet — on (anchor, reference) pairs
(ASAP DML, paper §4.1–4.3, Alg. 1, A.2; docs/readings/asap.md).

With anchors a and references k, already mapped by 𝒩 (d = ‖a − k‖₂, s = aᵀk; P_a / N_a = same-class /
other-class references):

* C1 (contrastive, Hadsell 2006, XBM's official code; ASAP-R29):
  (1/n_a) Σ_a [ Σ_{k∈P_a, s<1−ε} (1 − s) + Σ_{k∈N_a, s>μ} s ],  ε = 1e-5, μ = 0.5.
* C2 (contrastive with a positive margin, Wu 2017 = the generalized contrastive loss of eq. 4.2,
  (ι(d − β) + α)_+ with m^± = β ∓ α): [d − m⁺]_+ on positives, [m⁻ − d]_+ on negatives.
* MS (Wang 2019b): (1/n_a) Σ_a { (1/α) log[1 + Σ_{P_a} e^{−α(s−λ)}] + (1/β) log[1 + Σ_{N_a} e^{β(s−λ)}] }.
* Triplet (Schroff 2015): [d_ap − d_an + μ]_+ over every (a, p ∈ P_a, n ∈ N_a).

Readings (defaults = docs/readings/asap.md):

* ASAP-R10 ``reduction``: C2 ``"nonzero"`` (mean of the non-zero positive terms + mean of the non-zero
  negative terms), C1 ``"anchor"`` (sum / number of anchors), MS ``"anchor"`` (mean over anchors),
  Triplet ``"nonzero"`` (mean over triplets with a positive loss). ``"mean"`` is Alg. 1's plain mean over
  all |ρ|·m pairs (C1, C2; all triplets for Triplet). These names are run-config values
  (``loss.hparams.reduction``); the potential-field losses' ``"sum"`` / ``"mean"`` mean other things.
* ASAP-R11 ``mining=False`` (MS): no hard-pair mining; True is the original MS mining with ``epsilon=0.1``.
* C1 ``neg_offset=False``: the negative term is s (XBM); True uses s − μ (the later code).

Defaults of the hyperparameters are the CUB values of §2.6 (:mod:`dmlrepro.asap.settings` has every
dataset's).
"""

from __future__ import annotations

import torch

from .distances import pairwise_distances


def _masks(a_lab: torch.Tensor, r_lab: torch.Tensor, exclude_self: bool):
    same = a_lab.unsqueeze(1) == r_lab.unsqueeze(0)
    neg = ~same
    if exclude_self:
        same = same & ~torch.eye(len(a_lab), len(r_lab), dtype=torch.bool, device=same.device)
    return same, neg


def _nonzero_mean(terms: torch.Tensor) -> torch.Tensor:
    count = (terms > 0).sum()
    return terms.sum() / count.clamp_min(1)


class PairBase:
    """A pair loss called as ``base(anchors, anchor_labels, references, reference_labels, exclude_self)``."""

    reductions: tuple[str, ...] = ()
    default_reduction = ""

    def _check_reduction(self, reduction):
        reduction = self.default_reduction if reduction is None else reduction
        if reduction not in self.reductions:
            raise ValueError(f"{type(self).__name__}: reduction must be one of {self.reductions}, got {reduction!r}")
        return reduction


class C1(PairBase):
    """XBM's contrastive loss on similarities (ASAP-R29)."""

    reductions, default_reduction = ("anchor", "mean", "nonzero"), "anchor"

    def __init__(self, margin: float = 0.5, epsilon: float = 1e-5, neg_offset: bool = False, reduction=None):
        self.margin, self.epsilon, self.neg_offset = margin, epsilon, neg_offset
        self.reduction = self._check_reduction(reduction)

    def __call__(self, a, a_lab, r, r_lab, exclude_self=False):
        s = a @ r.T
        pos, neg = _masks(a_lab, r_lab, exclude_self)
        pos_terms = torch.where(pos & (s < 1 - self.epsilon), 1 - s, torch.zeros_like(s))
        neg_val = s - self.margin if self.neg_offset else s
        neg_terms = torch.where(neg & (s > self.margin), neg_val, torch.zeros_like(s))
        if self.reduction == "anchor":
            return (pos_terms.sum() + neg_terms.sum()) / len(a)
        if self.reduction == "mean":
            return (pos_terms.sum() + neg_terms.sum()) / (pos.sum() + neg.sum()).clamp_min(1)
        return _nonzero_mean(pos_terms[pos]) + _nonzero_mean(neg_terms[neg])


class C2(PairBase):
    """Contrastive loss with positive margin m⁺ and negative margin m⁻ on distances (eq. 4.2)."""

    reductions, default_reduction = ("nonzero", "mean"), "nonzero"

    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 0.3841, reduction=None):
        self.pos_margin, self.neg_margin = pos_margin, neg_margin
        self.reduction = self._check_reduction(reduction)

    def __call__(self, a, a_lab, r, r_lab, exclude_self=False):
        d = pairwise_distances(a, r)
        pos, neg = _masks(a_lab, r_lab, exclude_self)
        pos_terms = torch.relu(d[pos] - self.pos_margin)
        neg_terms = torch.relu(self.neg_margin - d[neg])
        if self.reduction == "nonzero":
            return _nonzero_mean(pos_terms) + _nonzero_mean(neg_terms)
        return (pos_terms.sum() + neg_terms.sum()) / max(pos_terms.numel() + neg_terms.numel(), 1)


class MS(PairBase):
    """Multi-similarity loss (Wang 2019b); `base` is the paper's λ of MS."""

    reductions, default_reduction = ("anchor",), "anchor"

    def __init__(
        self,
        alpha: float = 2.0,
        beta: float = 40.0,
        base: float = 0.5,
        mining: bool = False,
        epsilon: float = 0.1,
        reduction=None,
    ):
        self.alpha, self.beta, self.base, self.mining, self.epsilon = alpha, beta, base, mining, epsilon
        self.reduction = self._check_reduction(reduction)

    def __call__(self, a, a_lab, r, r_lab, exclude_self=False):
        s = a @ r.T
        pos, neg = _masks(a_lab, r_lab, exclude_self)
        if self.mining:
            pos, neg = self._mine(s.detach(), pos, neg)
        zero = s.new_zeros(len(a), 1)
        pos_x = (-self.alpha * (s - self.base)).masked_fill(~pos, -torch.inf)
        neg_x = (self.beta * (s - self.base)).masked_fill(~neg, -torch.inf)
        pos_loss = torch.logsumexp(torch.cat([zero, pos_x], 1), 1) / self.alpha
        neg_loss = torch.logsumexp(torch.cat([zero, neg_x], 1), 1) / self.beta
        return (pos_loss + neg_loss).mean()

    def _mine(self, sd: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor):
        """The original MS pair mining (ASAP-R11): positives below the hardest negative + ε, negatives
        above the hardest positive − ε."""
        max_neg = sd.masked_fill(~neg, -torch.inf).amax(1, keepdim=True)
        min_pos = sd.masked_fill(~pos, torch.inf).amin(1, keepdim=True)
        return pos & (sd - self.epsilon < max_neg), neg & (sd + self.epsilon > min_pos)


class Triplet(PairBase):
    """Triplet margin loss over all valid triplets on Euclidean distances."""

    reductions, default_reduction = ("nonzero", "mean"), "nonzero"

    def __init__(self, margin: float = 0.0961, reduction=None):
        self.margin = margin
        self.reduction = self._check_reduction(reduction)

    def __call__(self, a, a_lab, r, r_lab, exclude_self=False):
        d = pairwise_distances(a, r)
        pos, neg = _masks(a_lab, r_lab, exclude_self)
        ai, pi = pos.nonzero(as_tuple=True)  # one row per (anchor, positive) pair; negatives across
        terms = torch.relu(d[ai, pi].unsqueeze(1) - d[ai] + self.margin)
        terms = terms[neg[ai]]
        if self.reduction == "nonzero":
            return _nonzero_mean(terms)
        return terms.sum() / max(terms.numel(), 1)


#: the base names of the loss table's ``asap_*``, ``pair_*`` and ``xbm_*`` entries
BASES = {"c1": C1, "c2": C2, "ms": MS, "triplet": Triplet}


def build_pair_base(base: str, hparams: dict) -> PairBase:
    """The pair loss called `base` with `hparams`; ValueError / TypeError naming it."""
    if base not in BASES:
        raise ValueError(f"unknown ASAP base loss {base!r}; known: {sorted(BASES)}")
    try:
        return BASES[base](**hparams)
    except TypeError as error:
        raise TypeError(f"{base}: bad hyperparameters {sorted(hparams)}: {error}") from error


__all__ = ["BASES", "C1", "C2", "MS", "PairBase", "Triplet", "build_pair_base"]
