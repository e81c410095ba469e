"""Losses of the three papers and their baselines, built by name from config (`build_loss`).

Each loss module declares its losses (:mod:`.registry`: name, paper, proxies, lr groups, config
defaults); importing this package imports every module, so every declaration is registered.
"""

from __future__ import annotations

from torch import nn

from .asap import ASAP_LOSSES, ASAPLoss, PairLoss
from .baselines import BASELINES, MinedLoss, ProxyNCAPaperLoss, build_baseline
from .cpml import CPMLLoss
from .hist import HISTLoss
from .pfml import PFMLLoss
from .proxies import has_proxies, proxy_points, trained_proxies, use_sample_proxies
from .registry import BUILT_AS, LossSpec, Paper, Proxies, loss_names, loss_spec, register_loss, spec_of
from .rsw import RSW_FUNCTIONS, RSWLoss
from .xbm import XBM_LOSSES, XBMLoss


def __getattr__(name: str):
    if name == "LOSS_NAMES":  # every registered loss, those registered after this import included
        return loss_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_loss(name: str, num_classes: int, embedding_size: int, **hparams) -> nn.Module:
    """The loss called `name` in config, with `hparams` as its keyword arguments.

    Every loss is called as `loss(embeddings, labels)` and returns a scalar; its learnable
    parameters (proxies, class weights) are `loss.parameters()`. The loss remembers the name it was
    built as, which finds its declaration (`spec_of`).
    """
    spec = loss_spec(name)
    try:
        loss = spec.build(num_classes, embedding_size, **hparams)
    except TypeError as error:  # an unknown or misspelt hyperparameter
        raise TypeError(f"loss {name!r}: bad hyperparameters {sorted(hparams)}: {error}") from error
    setattr(loss, BUILT_AS, name)
    return loss


__all__ = [
    "ASAPLoss",
    "ASAP_LOSSES",
    "BASELINES",
    "CPMLLoss",
    "HISTLoss",
    "LOSS_NAMES",
    "LossSpec",
    "MinedLoss",
    "PFMLLoss",
    "PairLoss",
    "Paper",
    "Proxies",
    "ProxyNCAPaperLoss",
    "RSWLoss",
    "RSW_FUNCTIONS",
    "XBMLoss",
    "XBM_LOSSES",
    "build_baseline",
    "build_loss",
    "has_proxies",
    "loss_names",
    "loss_spec",
    "proxy_points",
    "register_loss",
    "spec_of",
    "trained_proxies",
    "use_sample_proxies",
]
