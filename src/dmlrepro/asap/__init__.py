"""ASAP DML's algorithmic core (paper Sec. 4, Alg. 1–2; docs/readings/asap.md): Lipschitz normalisation, greedy k-Center proxy
selection, the proximal regulariser, the alternation schedule and the wrapped pair losses.

One concept per module; not yet wired into the training engine (docs/asap.md).
"""

from .kcenter import (KCenterSelection, covering_radius, farthest_first, initial_proxies,
                      mean_class_covering_radius, pool_size, sample_pools, select_proxies)
from .losses import ASAP_LOSSES, ASAPLoss, PairLoss, build_asap_loss
from .normalisation import lipschitz_normalize, normalize
from .proximal import ProximalRegularizer
from .schedule import AlternationSchedule, Decision
from .settings import SETTINGS, asap_settings

__all__ = ["ASAPLoss", "ASAP_LOSSES", "AlternationSchedule", "Decision", "KCenterSelection", "PairLoss",
           "ProximalRegularizer", "SETTINGS", "asap_settings", "build_asap_loss", "covering_radius",
           "farthest_first", "initial_proxies", "lipschitz_normalize", "mean_class_covering_radius",
           "normalize", "pool_size", "sample_pools", "select_proxies"]
