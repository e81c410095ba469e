"""Proxy-trap diagnostics: can a proxy loss's proxies still move towards the data when training ends?

PFML's claims rest on its proxies reaching the data (W₂ ≤ δ, supp. eq. (16)). Three ways they can be
trapped instead (docs/readings/pfml.md#pfml-r4), each measured here on the final state:

* ``proxy_spread``: the median, over classes with two or more proxies, of the median distance
  between a class's proxies, over δ. Below 1 a class's proxies sit in one δ-sized clump, inside
  which eqs. (4)/(6)'s potentials are flat: M proxies act as one.
* ``zero_grad_share``: the share of (proxy, batch) pairs whose loss gradient is exactly zero, over
  batches of the embedded training set drawn as the run's sampler draws them (classes × m).
* ``step_ratio``: the median, over proxies, of Adam's last update ‖lr · m̂ / (√v̂ + ε)‖ over the
  move lr·√D the miniature's scaling rule assumes (docs/miniature.md#the-scaling-rule, rule 2).

Plain functions over arrays, a loss module and an optimizer; the engine records them with
``eval.proxy_metrics: [trap]`` (metrics.json ``proxy_metrics``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

#: the keys metrics.json `proxy_metrics` gains with `trap`
TRAP_KEYS = ("proxy_spread", "zero_grad_share", "step_ratio")


def intra_class_spread(proxies: Any, proxy_labels: Any) -> float | None:
    """Median over classes of the median pairwise distance between the class's proxies (float64);
    None when no class has two proxies."""
    p = torch.as_tensor(proxies).detach().to("cpu", torch.float64)
    y = torch.as_tensor(proxy_labels).to("cpu")
    medians = []
    for c in torch.unique(y):
        members = p[y == c]
        if len(members) < 2:
            continue
        d = torch.cdist(members, members)
        upper = torch.triu_indices(len(members), len(members), offset=1)
        medians.append(float(d[upper[0], upper[1]].median()))
    return float(np.median(medians)) if medians else None


def sampler_batches(labels: Any, batch_size: int, m: int | None, n_batches: int, seed: int = 0) -> list[np.ndarray]:
    """`n_batches` index batches of `labels`: batch_size / m classes × m images each (m_per_class), or
    batch_size images at random (m None)."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    if m is None:
        return [rng.choice(len(labels), size=min(batch_size, len(labels)), replace=False) for _ in range(n_batches)]
    classes = np.unique(labels)
    by_class = {c: np.flatnonzero(labels == c) for c in classes}
    out = []
    for _ in range(n_batches):
        chosen = rng.choice(classes, size=min(batch_size // m, len(classes)), replace=False)
        out.append(np.concatenate([rng.choice(by_class[c], size=m, replace=len(by_class[c]) < m) for c in chosen]))
    return out


def zero_gradient_share(
    loss: nn.Module, proxies: nn.Parameter, embeddings: Any, labels: Any, batches: list[np.ndarray]
) -> float:
    """Share of (proxy row, batch) pairs whose gradient of `loss(embeddings[batch], labels[batch])`
    with respect to `proxies` is exactly zero."""
    x, y = torch.as_tensor(np.asarray(embeddings), dtype=proxies.dtype), torch.as_tensor(np.asarray(labels))
    zero = 0
    with torch.enable_grad():
        for batch in batches:
            idx = torch.as_tensor(batch)
            (grad,) = torch.autograd.grad(loss(x[idx], y[idx]), proxies, allow_unused=True)
            zero += len(proxies) if grad is None else int((grad.reshape(len(proxies), -1) == 0).all(dim=1).sum())
    return zero / (len(proxies) * len(batches))


def adam_step_ratio(optimizer: torch.optim.Optimizer, proxies: nn.Parameter) -> float | None:
    """Median over rows of Adam's last update of `proxies`, lr · m̂ / (√v̂ + ε) with the bias
    corrections of torch.optim.Adam, over lr·√D; None when the optimizer holds no Adam state for them."""
    state = optimizer.state.get(proxies) or {}
    if "exp_avg" not in state or "exp_avg_sq" not in state:
        return None
    group = next(g for g in optimizer.param_groups if any(p is proxies for p in g["params"]))
    (beta1, beta2), eps = group["betas"], group["eps"]
    t = float(state["step"])
    m_hat = state["exp_avg"].double() / (1 - beta1**t)
    v_hat = state["exp_avg_sq"].double() / (1 - beta2**t)
    rows = (m_hat / (v_hat.sqrt() + eps)).reshape(len(proxies), -1)  # the update over lr
    return float(rows.norm(dim=1).median()) / math.sqrt(rows.shape[1])
