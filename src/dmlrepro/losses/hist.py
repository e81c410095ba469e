"""HIST: Hypergraph-Induced Semantic Tuplet loss (Lim et al., CVPR 2022), a baseline of PFML Table 2
and RSW Tables IV, VI and VII. A port of the official code (github.com/ljin0429/HIST, code/hist.py and
the loss of code/train.py).

For a batch of embeddings x_i (l2-normalised here, as the code does) with labels y_i, one class
prototype distribution per class c, mean μ_c (l2-normalised) and diagonal covariance
Σ_c = diag(exp(relu6(ℓ_c))), the squared Mahalanobis distance is

    d_ic = Σ_f (x̂_if − μ̂_cf)² / exp(relu6(ℓ_cf))

* distribution loss: L_D = mean_i −log softmax_c(−τ·d_i·)_{y_i}
  (the code's form: the softmax is taken, then rows whose probability underflows to 0 are dropped);
* semantic tuplets: a hypergraph whose hyperedges are the classes present in the batch, with
  incidence H_ic = 1 if y_i = c, else exp(−α·d_ic)
* a two-layer HGNN (Feng et al. 2019) on the raw embeddings x_i with propagation
  G = D_v^{-1/2} H W D_e^{-1} Hᵀ D_v^{-1/2} (W = I; D_v, D_e the node and edge degrees):
  z = G·θ₂(LeakyReLU₀.₁(BN(G·θ₁(x))))
* L = L_D + λ_s · CE(z, y)

The HGNN trains at ``hgnn_lr_factor`` × the backbone's lr (the code's ``--lr-hgnn-factor``):
``linked_lr_groups``, declared as its lr groups (dmlrepro.train.optim). The distributions (μ, ℓ) are
the ``loss`` group (the code's ``--lr-ds``: set ``optimizer.lr_mult.loss`` to lr_ds / lr).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import Paper, register_loss

# the code's net/resnet.py: GAP + GMP summed, Linear (kaiming fan_out, bias 0), then LayerNorm(D, no affine);
# the loss l2-normalises for its distributions, evaluation is cosine.
HIST = Paper(
    "hist",
    "Lim et al., Hypergraph-Induced Semantic Tuplet Loss for Deep Metric Learning, CVPR 2022",
    preset={"pool": "avg+max", "head": "linear_layernorm", "head_init": "kaiming_fan_out", "l2_normalize": False},
)


def mahalanobis_sq(x: torch.Tensor, means: torch.Tensor, log_vars: torch.Tensor) -> torch.Tensor:
    """(N, C) squared Mahalanobis distances of (N, F) points to C diagonal Gaussians."""
    diff = x.unsqueeze(1) - means.unsqueeze(0)
    return (diff.pow(2) / log_vars.exp().unsqueeze(0)).sum(dim=-1)


def propagation_matrix(incidence: torch.Tensor) -> torch.Tensor:
    """G = D_v^{-1/2} H D_e^{-1} Hᵀ D_v^{-1/2} of an (N, E) incidence matrix, unit hyperedge weights."""
    node_scale = incidence.sum(dim=1).rsqrt()
    scaled = incidence * node_scale.unsqueeze(1)
    return (scaled / incidence.sum(dim=0)) @ scaled.t()


class HGNN(nn.Module):
    """The code's two-layer hypergraph network: Linear → G· → BN → LeakyReLU(0.1) → Linear → G·."""

    def __init__(self, embedding_size: int, hidden: int, num_classes: int):
        super().__init__()
        self.theta1 = nn.Linear(embedding_size, hidden)
        self.bn1 = nn.BatchNorm1d(hidden)
        self.theta2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor, incidence: torch.Tensor) -> torch.Tensor:
        g = propagation_matrix(incidence)
        h = F.leaky_relu(self.bn1(g @ self.theta1(x)), 0.1)
        return g @ self.theta2(h)


@register_loss("hist", paper=HIST, lr_groups=lambda loss: loss.linked_lr_groups(), origin="official code")
class HISTLoss(nn.Module):
    """L_D + λ_s·CE of the HGNN's node classification. Defaults: the code's argparse defaults.

    Args:
        tau: the softmax scale τ of the distribution loss (``--tau``).
        alpha: the hardness α of the hyperedge incidences (``--alpha``).
        lambda_s: the weight λ_s of the HGNN's cross-entropy (``--ls``).
        hgnn_hidden: the HGNN's hidden width (``--hgnn-hidden``).
        hgnn_lr_factor: the HGNN's lr as a multiple of the backbone's (``--lr-hgnn-factor``).
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        tau: float = 32.0,
        alpha: float = 0.9,
        lambda_s: float = 1.0,
        hgnn_hidden: int = 512,
        hgnn_lr_factor: float = 10.0,
    ):
        super().__init__()
        self.num_classes = num_classes
        self.tau, self.alpha, self.lambda_s, self.hgnn_lr_factor = tau, alpha, lambda_s, hgnn_lr_factor
        self.means = nn.Parameter(torch.empty(num_classes, embedding_size))
        self.log_vars = nn.Parameter(torch.empty(num_classes, embedding_size))
        nn.init.kaiming_normal_(self.means, mode="fan_out")
        nn.init.kaiming_normal_(self.log_vars, mode="fan_out")
        self.hgnn = HGNN(embedding_size, int(hgnn_hidden), num_classes)

    def linked_lr_groups(self) -> dict[str, tuple[list[nn.Parameter], str, float]]:
        return {"hgnn": (list(self.hgnn.parameters()), "backbone", self.hgnn_lr_factor)}

    def distributions(self, embeddings: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L_D, H): the distribution loss and the (N, classes in the batch) incidence H."""
        distance = mahalanobis_sq(
            F.normalize(embeddings, dim=-1), F.normalize(self.means, dim=-1), F.relu6(self.log_vars)
        )
        one_hot = F.one_hot(labels, self.num_classes).to(distance.dtype)
        p_true = (F.softmax(-self.tau * distance, dim=1) * one_hot).sum(dim=1)
        # the code's -log p over the samples whose p did not underflow to 0, as a log-softmax: a p that is tiny
        # but not 0 has the gradient 1/p of log (non-finite) in the code's form, a finite one here
        log_p_true = (F.log_softmax(-self.tau * distance, dim=1) * one_hot).sum(dim=1)
        loss = -log_p_true[p_true != 0].mean()
        present = one_hot.sum(dim=0) != 0
        incidence = one_hot[:, present] + (-self.alpha * distance[:, present]).exp() * (1 - one_hot[:, present])
        return loss, incidence

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        distribution_loss, incidence = self.distributions(embeddings, labels)
        logits = self.hgnn(embeddings, incidence)
        return distribution_loss + self.lambda_s * F.cross_entropy(logits, labels)
