"""ASAP DML's algorithmic core (paper Sec. 4, Alg. 1–2; docs/readings/asap.md): Lipschitz normalisation, greedy
k-Center proxy selection, the proximal regulariser, the alternation schedule and the per-dataset settings.

One concept per module; the training engine runs them (docs/asap.md). The losses (ASAPLoss, PairLoss and
their pair bases) are in :mod:`dmlrepro.losses` and built by `build_loss`.
"""

from .kcenter import (
    KCenterSelection,
    covering_radius,
    farthest_first,
    initial_proxies,
    mean_class_covering_radius,
    pool_size,
    sample_pools,
    select_proxies,
)
from .normalisation import lipschitz_normalize, normalize
from .proximal import ProximalRegularizer
from .schedule import AlternationSchedule, Decision
from .settings import SETTINGS, asap_settings

__all__ = [
    "AlternationSchedule",
    "Decision",
    "KCenterSelection",
    "ProximalRegularizer",
    "SETTINGS",
    "asap_settings",
    "covering_radius",
    "farthest_first",
    "initial_proxies",
    "lipschitz_normalize",
    "mean_class_covering_radius",
    "normalize",
    "pool_size",
    "sample_pools",
    "select_proxies",
]
