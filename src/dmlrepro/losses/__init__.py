"""Losses of the three papers and their baselines, built by name from config (`build_loss`)."""

from __future__ import annotations

from torch import nn

from .asap import ASAP_LOSSES, ASAPLoss, PairLoss
from .baselines import BASELINES, MinedLoss, ProxyNCAPaperLoss, build_baseline
from .cpml import CPMLLoss
from .hist import HISTLoss
from .pfml import PFMLLoss
from .proxies import proxy_points
from .rsw import RSW_FUNCTIONS, RSWLoss
from .xbm import XBM_LOSSES, XBMLoss

# the papers' own losses, and the baselines written here (XBM wrappers, HIST: no PML class does them)
PAPER_LOSSES = {"pfml": PFMLLoss, "cpml": CPMLLoss, "rsw": RSWLoss, "hist": HISTLoss, **ASAP_LOSSES, **XBM_LOSSES}
LOSS_NAMES = tuple(sorted([*PAPER_LOSSES, *BASELINES, "proxy_nca_paper"]))


def build_loss(name: str, num_classes: int, embedding_size: int, **hparams) -> nn.Module:
    """The loss called `name` in config, with `hparams` as its keyword arguments.

    Every loss is called as `loss(embeddings, labels)` and returns a scalar; its learnable
    parameters (proxies, class weights) are `loss.parameters()`.
    """
    if name not in LOSS_NAMES:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(LOSS_NAMES)}")
    try:
        if name in PAPER_LOSSES:
            return PAPER_LOSSES[name](num_classes, embedding_size, **hparams)
        return build_baseline(name, num_classes, embedding_size, **hparams)
    except TypeError as error:  # an unknown or misspelt hyperparameter
        raise TypeError(f"loss {name!r}: bad hyperparameters {sorted(hparams)}: {error}") from error


__all__ = ["ASAPLoss", "ASAP_LOSSES", "BASELINES", "CPMLLoss", "HISTLoss", "LOSS_NAMES", "MinedLoss", "PFMLLoss",
           "PairLoss", "ProxyNCAPaperLoss", "RSWLoss", "RSW_FUNCTIONS", "XBMLoss", "XBM_LOSSES", "build_loss",
           "proxy_points"]
