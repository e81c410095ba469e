"""Baseline losses from pytorch-metric-learning (PML), behind one table.

Defaults follow the Proxy-Anchor code's PML wrappers, the lineage of PFML's baselines
(docs/readings/pfml.md#pfml-r9: PA α=32 δ=0.1; ProxyNCA softmax_scale 32; MS (2, 50, 0.5)
+ miner ε=0.1; Triplet margin 0.1 + semihard miner; Contrastive neg_margin 0.5), else PML's own.
Each entry's `note` says where PML's definition departs from the paper that introduced the loss;
`proxy_nca_paper` gives the original ProxyNCA form where PML's differs.

SoftTriple's centre regulariser τ·R(w) (Qian et al. 2019, eq. 10-11) is the hparam `tau`: off (0) by
default, as in PML's own SoftTripleLoss (so runs without the key keep their ids); when τ > 0 and
centers_per_class > 1 it is attached as PML's weight regulariser (`weight_regularizer=`,
`weight_reg_weight=τ`), computed class by class (`BlockSparseCentersRegularizer`, pml_regularizers.py).

PML is imported on purpose only when a baseline is built: `import pytorch_metric_learning` pulls in
scipy.stats, about a quarter of a training job's start-up, which the papers' own losses do not need.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .registry import Paper, Proxies, register_loss


def __getattr__(name: str):
    if name == "BlockSparseCentersRegularizer":
        from .pml_regularizers import BlockSparseCentersRegularizer  # deferred: imports PML (module docstring)

        return BlockSparseCentersRegularizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# the Proxy-Anchor code (net/resnet.py, net/bn_inception.py): GAP+GMP summed, Linear with kaiming fan_out and
# bias 0, L2 normalised output
PROXY_ANCHOR = Paper(
    "proxy_anchor",
    "Kim et al., Proxy Anchor Loss for Deep Metric Learning, CVPR 2020",
    preset={"pool": "avg+max", "head": "linear", "head_init": "kaiming_fan_out", "l2_normalize": True},
)
# MLRC (powerful-benchmarker): BN-Inception trunk, GAP, MLP embedder [128] with default init; embeddings are
# normalised by the losses/tester, not by the model
MLRC = Paper(
    "mlrc",
    "Musgrave et al., A Metric Learning Reality Check, ECCV 2020 (pytorch-metric-learning's losses)",
    preset={"pool": "avg", "head": "mlp", "mlp_hidden": [], "head_init": "default", "l2_normalize": False},
)
PROXY_NCA = Paper("proxy_nca", "Movshovitz-Attias et al., No Fuss Distance Metric Learning using Proxies, ICCV 2017")


def _on_sphere(points: torch.Tensor, loss: nn.Module) -> torch.Tensor:
    return F.normalize(points, dim=-1)


#: the proxy losses' proxies: cosine losses, so on the unit sphere (docs/readings/pfml.md#pfml-r24)
PROXIES = Proxies(tensor=lambda loss: loss.proxies, space=_on_sphere)
CLASS_WEIGHTS = Proxies(tensor=lambda loss: loss.W.t(), space=_on_sphere)
SOFT_TRIPLE_CENTRES = Proxies(
    tensor=lambda loss: loss.fc.t(), per_class=lambda loss: loss.centers_per_class, space=_on_sphere
)  # column c·K + k of fc is centre k of class c


@dataclass(frozen=True)
class Baseline:
    pml_class: str
    defaults: dict = field(default_factory=dict)
    has_classes: bool = False  # constructor takes (num_classes, embedding_size): a classifier/proxy loss
    note: str = ""
    proxies: Proxies | None = None
    paper: Paper = MLRC


BASELINES: dict[str, Baseline] = {
    "proxy_anchor": Baseline(
        "ProxyAnchorLoss",
        {"margin": 0.1, "alpha": 32},
        True,
        "As in Kim et al. 2020 (cosine, positive term averaged over proxies with positives).",
        PROXIES,
        PROXY_ANCHOR,
    ),
    "proxy_nca": Baseline(
        "ProxyNCALoss",
        {"softmax_scale": 32},
        True,
        "PML's softmax denominator includes the target proxy (= normalised softmax on "
        "squared distances); the ProxyNCA paper's excludes it: see `proxy_nca_paper`.",
        PROXIES,
    ),
    "soft_triple": Baseline(
        "SoftTripleLoss",
        {"centers_per_class": 10, "la": 20, "gamma": 0.1, "margin": 0.01},
        True,
        "As in Qian et al. 2019; PFML Table 3 sets centers_per_class to PFML's M. The centre "
        "regulariser τ·R(w) is the hparam `tau` (default 0 = off, PML's default; only acts "
        "with centers_per_class > 1).",
        SOFT_TRIPLE_CENTRES,
    ),
    "multi_similarity": Baseline(
        "MultiSimilarityLoss",
        {"alpha": 2, "beta": 50, "base": 0.5},
        note="As in Wang et al. 2019, with PML's MultiSimilarityMiner (epsilon).",
    ),
    "triplet": Baseline(
        "TripletMarginLoss",
        {"margin": 0.1},
        note="Euclidean distance on normalised embeddings, mean over triplets with "
        "non-zero loss; semihard triplets from PML's TripletMarginMiner.",
    ),
    "contrastive": Baseline(
        "ContrastiveLoss",
        {"pos_margin": 0.0, "neg_margin": 0.5},
        note="PML uses hinge on the (unsquared) distance, averaged over non-zero pairs.",
    ),
    "normalized_softmax": Baseline("NormalizedSoftmaxLoss", {"temperature": 0.05}, True, proxies=CLASS_WEIGHTS),
    "arcface": Baseline(
        "ArcFaceLoss", {"margin": 28.6, "scale": 64}, True, "PML's margin is in degrees.", CLASS_WEIGHTS
    ),
    "cosface": Baseline("CosFaceLoss", {"margin": 0.35, "scale": 64}, True, proxies=CLASS_WEIGHTS),
    "npair": Baseline(
        "NPairsLoss",
        {},
        note="One positive pair per label in the batch, dot-product similarity; the paper's L2 "
        "penalty on embeddings is not included.",
    ),
}


class MinedLoss(nn.Module):
    """A PML loss fed by a PML miner: loss(embeddings, labels, miner(embeddings, labels))."""

    def __init__(self, loss: nn.Module, miner: nn.Module):
        super().__init__()
        self.loss, self.miner = loss, miner

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss(embeddings, labels, self.miner(embeddings, labels))


@register_loss("proxy_nca_paper", paper=PROXY_NCA, proxies=PROXIES)
class ProxyNCAPaperLoss(nn.Module):
    """ProxyNCA as published (Movshovitz-Attias et al. 2017): the target proxy is left out of the
    denominator, L_i = −log(exp(−s·d(x_i, p_y)) / Σ_{j≠y} exp(−s·d(x_i, p_j))), with d the squared
    distance of ℓ2-normalised vectors and s = softmax_scale as in PML; mean over the batch.
    The loss can be negative."""

    def __init__(self, num_classes: int, embedding_size: int, softmax_scale: float = 32.0):
        super().__init__()
        self.softmax_scale = softmax_scale
        self.proxies = nn.Parameter(torch.randn(num_classes, embedding_size))  # PML's default init (normal_)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x, p = F.normalize(embeddings.float(), dim=-1), F.normalize(self.proxies.float(), dim=-1)
        logits = -self.softmax_scale * (2.0 - 2.0 * x @ p.T)  # ‖x − p‖² of unit vectors
        target = logits.gather(1, labels[:, None].long()).squeeze(1)
        others = logits.scatter(1, labels[:, None].long(), float("-inf"))
        return (torch.logsumexp(others, dim=1) - target).mean()


def build_baseline(name: str, num_classes: int, embedding_size: int, **hparams) -> nn.Module:
    """A PML baseline by name; `hparams` override the defaults (miner keys: see the two mined losses)."""
    # deferred heavy import on purpose: PML (and scipy.stats) load only for the runs that use a baseline
    from pytorch_metric_learning import losses, miners

    spec = BASELINES[name]
    miner_args = {key: hparams.pop(key) for key in ("miner", "miner_epsilon", "miner_margin") if key in hparams}
    args = {**spec.defaults, **hparams}
    if name == "soft_triple" and not (
        isinstance(args.get("centers_per_class"), int) and args["centers_per_class"] >= 1
    ):
        # PML accepts 0 and fails at the first step ("cannot reshape tensor of 0 elements")
        raise ValueError(
            f"soft_triple: centers_per_class = {args.get('centers_per_class')!r}: expected an integer >= 1"
        )
    if name == "soft_triple":
        tau = args.pop("tau", 0.0)
        if not (isinstance(tau, (int, float)) and not isinstance(tau, bool) and tau >= 0):
            raise ValueError(f"soft_triple: tau = {tau!r}: expected a number >= 0")
        if tau > 0 and args["centers_per_class"] > 1:  # R(w) is 0 (and PML's class refuses K = 1) otherwise
            from .pml_regularizers import BlockSparseCentersRegularizer  # deferred: imports PML (module docstring)

            args["weight_regularizer"] = BlockSparseCentersRegularizer(num_classes, args["centers_per_class"])
            args["weight_reg_weight"] = float(tau)
    loss_class = getattr(losses, spec.pml_class)
    loss = loss_class(num_classes, embedding_size, **args) if spec.has_classes else loss_class(**args)
    if name == "multi_similarity":
        epsilon = miner_args.pop("miner_epsilon", 0.1)
        loss = loss if epsilon is None else MinedLoss(loss, miners.MultiSimilarityMiner(epsilon=epsilon))
    elif name == "triplet":
        kind, margin = miner_args.pop("miner", "semihard"), miner_args.pop("miner_margin", args["margin"])
        loss = (
            loss if kind is None else MinedLoss(loss, miners.TripletMarginMiner(margin=margin, type_of_triplets=kind))
        )
    if miner_args:
        raise TypeError(f"loss {name!r} takes no miner options {sorted(miner_args)}")
    return loss


def _register_baselines() -> None:
    """Each PML baseline; the numbers among its defaults are the config check's numeric hyperparameters."""
    for name, baseline in BASELINES.items():
        numeric = {
            key: False
            for key, value in baseline.defaults.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        register_loss(
            name,
            paper=baseline.paper,
            build=functools.partial(build_baseline, name),
            proxies=baseline.proxies,
            numeric_hparams=numeric,
            origin="library",
            hparam_defaults=baseline.defaults,
        )


_register_baselines()
