"""A loss of your own, declared outside dmlrepro (docs/tasks/own-loss.md).

dmlrepro imports this module when a run config names ``loss.name: my_losses:CentredSoftmax``; the
folder that holds it must be importable where the runs run (``PYTHONPATH=config/examples``, or your
own installed package). ``register_loss`` is the declaration dmlrepro's own losses use
(docs/losses.md#adding-a-loss): the paper it comes from, its proxies (the proxy metrics and
final_proxies.npz read them) and the hyperparameters the resolved config records.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmlrepro.losses import Paper, Proxies, register_loss

#: the paper your loss comes from: its key names it in the catalog, its citation in `dmlrepro losses`
MINE = Paper("mine", "Your Name, Your Paper's Title, 2026")


@register_loss(
    "centred_softmax",
    paper=MINE,
    proxies=Proxies(tensor=lambda loss: loss.proxies, space=lambda points, loss: F.normalize(points, dim=-1)),
)
class CentredSoftmax(nn.Module):
    """Cross-entropy over the negative squared distances, divided by ``temperature``, between the
    ℓ2-normalised embeddings and one ℓ2-normalised learnable proxy per class."""

    def __init__(self, num_classes: int, embedding_size: int, temperature: float = 0.1):
        super().__init__()
        self.temperature = temperature
        self.proxies = nn.Parameter(0.1 * torch.randn(num_classes, embedding_size))

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        distances = torch.cdist(F.normalize(embeddings, dim=-1), F.normalize(self.proxies, dim=-1)).pow(2)
        return F.cross_entropy(-distances / self.temperature, labels)
