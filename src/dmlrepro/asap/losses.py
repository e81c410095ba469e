"""The four pair losses ASAP wraps — C1, C2, MS, Triplet — on proxy–sample pairs (ASAP) and on
batch×batch pairs (the plain baselines). Paper §4.1–4.3, Alg. 1, A.2.

Vectors are first mapped by 𝒩(v) = v / max(1, ‖v‖) (paper §4.4; `normalize`). With anchors a and
references k (d = ‖𝒩a − 𝒩k‖₂, s = 𝒩aᵀ𝒩k; P_a / N_a = same-class / other-class references):

* C1 (contrastive, Hadsell 2006, XBM's official code; ASAP-R29):
  (1/n_a) Σ_a [ Σ_{k∈P_a, s<1−ε} (1 − s) + Σ_{k∈N_a, s>μ} s ],  ε = 1e-5, μ = 0.5.
* C2 (contrastive with a positive margin, Wu 2017 = the generalized contrastive loss of eq. 4.2,
  (ι(d − β) + α)_+ with m^± = β ∓ α): [d − m⁺]_+ on positives, [m⁻ − d]_+ on negatives.
* MS (Wang 2019b): (1/n_a) Σ_a { (1/α) log[1 + Σ_{P_a} e^{−α(s−λ)}] + (1/β) log[1 + Σ_{N_a} e^{β(s−λ)}] }.
* Triplet (Schroff 2015): [d_ap − d_an + μ]_+ over every (a, p ∈ P_a, n ∈ N_a).

ASAP (eq. 4.11, Alg. 1) pairs the batch samples with all C·P proxies; the baselines pair the batch
with itself, self-pairs excluded.

Ambiguity switches, defaults = the project's readings (docs/readings/asap.md):

* ASAP-R2 ``batch_pair_weight=0.0`` (ASAPLoss): weight of the in-batch sample–sample term added to the proxy
  term (paper Alg. 1: proxies only; later code 0.1). ``proxy_weight=1.0``.
* ASAP-R9 ``anchor="sample"`` (ASAPLoss): batch samples are anchors, proxies references (``"proxy"``: reversed).
* ASAP-R10 ``reduction``: C2 ``"nonzero"`` (mean of the non-zero positive terms + mean of the non-zero
  negative terms), C1 ``"anchor"`` (sum / number of anchors), MS ``"anchor"`` (mean over anchors),
  Triplet ``"nonzero"`` (mean over triplets with a positive loss). ``"mean"`` is Alg. 1's plain mean over
  all |ρ|·m pairs (C1, C2; all triplets for Triplet).
* ASAP-R11 ``mining=False`` (MS): no hard-pair mining; True is the original MS mining with ``epsilon=0.1``.
* C1 ``neg_offset=False``: the negative term is s (XBM); True uses s − μ (the later code).

Defaults of the loss hyperparameters are the CUB values of §2.6 (:mod:`dmlrepro.asap.settings`
has every dataset's).
"""

from __future__ import annotations


import torch
from torch import nn

from .normalisation import MODES, normalize

EPS2 = 1e-12


def _distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    d2 = (a * a).sum(-1, keepdim=True) + (b * b).sum(-1).unsqueeze(0) - 2.0 * (a @ b.T)
    return d2.clamp_min(EPS2).sqrt()


def _masks(a_lab: torch.Tensor, r_lab: torch.Tensor, exclude_self: bool):
    same = a_lab.unsqueeze(1) == r_lab.unsqueeze(0)
    neg = ~same
    if exclude_self:
        same = same & ~torch.eye(len(a_lab), len(r_lab), dtype=torch.bool, device=same.device)
    return same, neg


def _nonzero_mean(terms: torch.Tensor) -> torch.Tensor:
    count = (terms > 0).sum()
    return terms.sum() / count.clamp_min(1)


class _Base:
    reductions: tuple[str, ...] = ()
    default_reduction = ""

    def _check_reduction(self, reduction):
        reduction = self.default_reduction if reduction is None else reduction
        if reduction not in self.reductions:
            raise ValueError(f"{type(self).__name__}: reduction must be one of {self.reductions}, got {reduction!r}")
        return reduction


class C1(_Base):
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


class C2(_Base):
    """Contrastive loss with positive margin m⁺ and negative margin m⁻ on distances (eq. 4.2)."""

    reductions, default_reduction = ("nonzero", "mean"), "nonzero"

    def __init__(self, pos_margin: float = 0.0, neg_margin: float = 0.3841, reduction=None):
        self.pos_margin, self.neg_margin = pos_margin, neg_margin
        self.reduction = self._check_reduction(reduction)

    def __call__(self, a, a_lab, r, r_lab, exclude_self=False):
        d = _distances(a, r)
        pos, neg = _masks(a_lab, r_lab, exclude_self)
        pos_terms = torch.relu(d[pos] - self.pos_margin)
        neg_terms = torch.relu(self.neg_margin - d[neg])
        if self.reduction == "nonzero":
            return _nonzero_mean(pos_terms) + _nonzero_mean(neg_terms)
        return (pos_terms.sum() + neg_terms.sum()) / max(pos_terms.numel() + neg_terms.numel(), 1)


class MS(_Base):
    """Multi-similarity loss (Wang 2019b); `base` is the paper's λ of MS."""

    reductions, default_reduction = ("anchor",), "anchor"

    def __init__(self, alpha: float = 2.0, beta: float = 40.0, base: float = 0.5, mining: bool = False,
                 epsilon: float = 0.1, reduction=None):
        self.alpha, self.beta, self.base, self.mining, self.epsilon = alpha, beta, base, mining, epsilon
        self.reduction = self._check_reduction(reduction)

    def __call__(self, a, a_lab, r, r_lab, exclude_self=False):
        s = a @ r.T
        pos, neg = _masks(a_lab, r_lab, exclude_self)
        if self.mining:
            sd = s.detach()
            max_neg = sd.masked_fill(~neg, -torch.inf).amax(1, keepdim=True)
            min_pos = sd.masked_fill(~pos, torch.inf).amin(1, keepdim=True)
            pos = pos & (sd - self.epsilon < max_neg)
            neg = neg & (sd + self.epsilon > min_pos)
        zero = s.new_zeros(len(a), 1)
        pos_x = (-self.alpha * (s - self.base)).masked_fill(~pos, -torch.inf)
        neg_x = (self.beta * (s - self.base)).masked_fill(~neg, -torch.inf)
        pos_loss = torch.logsumexp(torch.cat([zero, pos_x], 1), 1) / self.alpha
        neg_loss = torch.logsumexp(torch.cat([zero, neg_x], 1), 1) / self.beta
        return (pos_loss + neg_loss).mean()


class Triplet(_Base):
    """Triplet margin loss over all valid triplets on Euclidean distances."""

    reductions, default_reduction = ("nonzero", "mean"), "nonzero"

    def __init__(self, margin: float = 0.0961, reduction=None):
        self.margin = margin
        self.reduction = self._check_reduction(reduction)

    def __call__(self, a, a_lab, r, r_lab, exclude_self=False):
        d = _distances(a, r)
        pos, neg = _masks(a_lab, r_lab, exclude_self)
        ai, pi = pos.nonzero(as_tuple=True)  # one row per (anchor, positive) pair; negatives across
        terms = torch.relu(d[ai, pi].unsqueeze(1) - d[ai] + self.margin)
        terms = terms[neg[ai]]
        if self.reduction == "nonzero":
            return _nonzero_mean(terms)
        return terms.sum() / max(terms.numel(), 1)


BASES = {"c1": C1, "c2": C2, "ms": MS, "triplet": Triplet}


def _make_base(base: str, hparams: dict):
    if base not in BASES:
        raise ValueError(f"unknown ASAP base loss {base!r}; known: {sorted(BASES)}")
    try:
        return BASES[base](**hparams)
    except TypeError as error:
        raise TypeError(f"{base}: bad hyperparameters {sorted(hparams)}: {error}") from error


class PairLoss(nn.Module):
    """A base loss on batch×batch pairs, self-pairs excluded (the `Loss` rows of the tables).

    `forward(embeddings, labels)` → scalar. No learnable parameters.
    """

    def __init__(self, base_loss: str, normalize: str = "lipschitz", **hparams):
        super().__init__()
        if normalize not in MODES:
            raise ValueError(f"PairLoss: normalize must be one of {MODES}, got {normalize!r}")
        self.base_name, self.normalize = base_loss, normalize
        self.base = _make_base(base_loss, hparams)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        e = normalize(embeddings, self.normalize)
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
        batch_pair_weight, proxy_weight: ASAP-R2, loss = proxy_weight·L(batch, proxies) + batch_pair_weight·L(batch, batch).
        normalize: "lipschitz" (paper), "l2" or "none"; applied to embeddings and proxies.
        proxy_init_std: std of the Gaussian placeholder init (overwritten by k-Center before training).
    """

    def __init__(self, base_loss: str, num_classes: int, embedding_size: int, proxies_per_class: int = 8,
                 anchor: str = "sample", batch_pair_weight: float = 0.0, proxy_weight: float = 1.0,
                 normalize: str = "lipschitz", proxy_init_std: float = 0.1, **hparams):
        super().__init__()
        if anchor not in ("sample", "proxy"):
            raise ValueError(f"ASAPLoss: anchor must be 'sample' or 'proxy', got {anchor!r}")
        if normalize not in MODES:
            raise ValueError(f"ASAPLoss: normalize must be one of {MODES}, got {normalize!r}")
        if num_classes < 1 or proxies_per_class < 1 or embedding_size < 1:
            raise ValueError(f"ASAPLoss: need num_classes, proxies_per_class, embedding_size >= 1, got "
                             f"{num_classes}, {proxies_per_class}, {embedding_size}")
        self.base_name, self.base = base_loss, _make_base(base_loss, hparams)
        self.num_classes, self.embedding_size, self.proxies_per_class = num_classes, embedding_size, proxies_per_class
        self.anchor, self.batch_pair_weight, self.proxy_weight, self.normalize = (
            anchor, batch_pair_weight, proxy_weight, normalize)
        self.proxies = nn.Parameter(torch.randn(num_classes * proxies_per_class, embedding_size) * proxy_init_std)
        self.register_buffer("proxy_labels", torch.arange(num_classes).repeat_interleave(proxies_per_class),
                             persistent=False)

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

    def proxies_3d(self) -> torch.Tensor:
        return self.proxies.view(self.num_classes, self.proxies_per_class, self.embedding_size)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor,
                proxies: torch.Tensor | None = None) -> torch.Tensor:
        """`proxies` (C·P, D), when given, replace ``self.proxies`` for this call (sample-based ASAP:
        the embeddings of the selected samples under the current θ; gradients flow into them)."""
        if proxies is None:
            proxies = self.proxies
        elif proxies.shape != self.proxies.shape:
            raise ValueError(f"ASAPLoss: proxies of shape {tuple(proxies.shape)}, expected {tuple(self.proxies.shape)}")
        e = normalize(embeddings, self.normalize)
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
        return PairLoss(base, **hparams)
    return build


#: name -> builder(num_classes, embedding_size, **hparams), the signature of `build_loss`'s table.
ASAP_LOSSES = {**{f"asap_{b}": _asap(b) for b in BASES}, **{f"pair_{b}": _pair(b) for b in BASES}}


def build_asap_loss(name: str, num_classes: int, embedding_size: int, **hparams) -> nn.Module:
    """The ASAP-paper loss called `name`: ``asap_{c1,c2,ms,triplet}`` (proxy pairs) or
    ``pair_{c1,c2,ms,triplet}`` (batch pairs, the plain baselines)."""
    if name not in ASAP_LOSSES:
        raise ValueError(f"unknown ASAP loss {name!r}; known: {', '.join(sorted(ASAP_LOSSES))}")
    return ASAP_LOSSES[name](num_classes, embedding_size, **hparams)


__all__ = ["ASAPLoss", "ASAP_LOSSES", "BASES", "C1", "C2", "MS", "PairLoss", "Triplet", "build_asap_loss"]
