"""Greedy k-Center proxy selection (ASAP paper Alg. 2, §4.3).

For each class c a pool of training samples is embedded with f(·; θ*) and P new proxies are picked
by farthest-first traversal *seeded with the class's current (converged) proxies* ρ_c:

    q ← argmax_{u ∈ pool \\ r_c}  min_{v ∈ ρ_c ∪ r_c} ‖u − v‖₂ ,   r_c ← r_c ∪ {q}    (P times)

Pool size (ASAP-R34, from the later code): b if b ≥ P, otherwise b·P (``small_budget="times_p"``);
b = 1 is plain random sampling of P samples per class (paper §4.3 "b = 1 reduces to random
sampling"), and b = P also selects the whole (random) pool. Ties in the argmax go to the lowest pool
position, so the selection is a pure function of the pool, the centres and the seed that drew the pool.

Ambiguity switches, defaults = the project's readings (docs/readings/asap.md):

* ASAP-R1 ``first_init`` (:func:`initial_proxies`): ``"kcenter_from_random"`` — ρ* = P random samples per
  class, then k-Center from ρ*; ``"random"`` — the random samples themselves; ``"kcenter_from_zero"`` —
  the later code's all-zero "current proxies" (first picks = largest-norm samples).
* ASAP-R6 ``normalize`` (pool and centres compared raw, i.e. un-normalised 128-D outputs: ``False``).
  Train augmentation on and BN in inference mode are properties of the `embed` callable the engine
  passes in; they are not decided here.
* ASAP-R15 (pool size of ASAP-S, P = 1): nothing special here — `b` is whatever the caller passes
  (the reading: the same b as ASAP-L, see :mod:`dmlrepro.asap.settings`).

Distances are computed in the difference form ‖u − v‖ (pools are small: b ≤ 16 per class), batched
over classes with torch; CPU or GPU tensors both work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dmlrepro.config_names import FIRST_INIT, SMALL_BUDGET  # the config check's choices, torch-free

from .normalisation import lipschitz_normalize


def pool_size(b: int, proxies_per_class: int, small_budget: str = "times_p") -> int:
    """Per-class pool size for budget `b` and P proxies per class.

    ``"times_p"`` (ASAP-R34, later code): b if b ≥ P else b·P (so b = 1 gives P random samples);
    ``"clip"``: max(b, P).
    """
    if b < 1 or proxies_per_class < 1:
        raise ValueError(f"pool_size: need b >= 1 and proxies_per_class >= 1, got b={b}, P={proxies_per_class}")
    if small_budget not in SMALL_BUDGET:
        raise ValueError(f"pool_size: small_budget must be one of {SMALL_BUDGET}, got {small_budget!r}")
    if b >= proxies_per_class:
        return b
    return b * proxies_per_class if small_budget == "times_p" else proxies_per_class


def _distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(C, n, D), (C, m, D) -> (C, n, m) Euclidean distances, difference form (exact for ties)."""
    return torch.linalg.vector_norm(a.unsqueeze(-2) - b.unsqueeze(-3), dim=-1)


def farthest_first(pools: torch.Tensor, k: int, centers: torch.Tensor | None = None) -> torch.Tensor:
    """Batched greedy k-Center: (C, n, D) pools, optional (C, m, D) centres -> (C, k) pool positions.

    Each row picks k distinct pool positions by farthest-first traversal from `centers` (Alg. 2).
    Without centres (or with m = 0) the first pick is pool position 0 (callers shuffle the pool).
    """
    if pools.dim() == 2:
        pools = pools.unsqueeze(0)
        if centers is not None and centers.dim() == 2:
            centers = centers.unsqueeze(0)
        return farthest_first(pools, k, centers)[0]
    num, n = pools.shape[0], pools.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"farthest_first: need 1 <= k <= pool size {n}, got k={k}")
    with torch.no_grad():
        if centers is not None and centers.shape[1] > 0:
            dmin = _distances(pools, centers.to(pools.dtype)).amin(-1)
        else:
            dmin = torch.full((num, n), torch.inf, dtype=pools.dtype, device=pools.device)
        picked = torch.empty(num, k, dtype=torch.long, device=pools.device)
        taken = torch.zeros(num, n, dtype=torch.bool, device=pools.device)
        rows = torch.arange(num, device=pools.device)
        for j in range(k):
            score = dmin.masked_fill(taken, -torch.inf)
            q = score.argmax(-1)  # first maximum: lowest pool position on ties
            picked[:, j] = q
            taken[rows, q] = True
            dmin = torch.minimum(dmin, _distances(pools, pools[rows, q].unsqueeze(1)).squeeze(-1))
    return picked


def class_index_lists(labels: torch.Tensor, num_classes: int) -> list[torch.Tensor]:
    """Dataset indices of each class 0..num_classes-1 (ascending)."""
    labels = torch.as_tensor(labels).long().cpu()
    order = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=num_classes)
    if counts.numel() > num_classes:
        raise ValueError(f"labels go up to {int(labels.max())}, but num_classes={num_classes}")
    if (counts == 0).any():
        missing = torch.nonzero(counts == 0).flatten()[:5].tolist()
        raise ValueError(f"classes without training samples (first: {missing}); every class needs proxies")
    return list(torch.split(order, counts.tolist()))


def sample_pools(labels: torch.Tensor, num_classes: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """(num_classes, size) dataset indices: `size` samples per class without replacement.

    A class with fewer than `size` samples is wrapped: its reshuffled indices are concatenated until
    `size` are drawn (later code `samplers.OnePerClass`, ASAP-R34).
    """
    out = torch.empty(num_classes, size, dtype=torch.long)
    for c, idx in enumerate(class_index_lists(labels, num_classes)):
        reps = -(-size // len(idx))
        perm = torch.cat([idx[torch.randperm(len(idx), generator=generator)] for _ in range(reps)])
        out[c] = perm[:size]
    return out


@dataclass
class KCenterSelection:
    """Result of one proxy selection: `indices` (C, P) dataset indices of the picked samples,
    `proxies` (C, P, D) their embeddings (the new proxies), `pool` (C, n) the pool's dataset indices,
    `picked` (C, P) positions in the pool, `seconds` wall time (embedding + selection)."""

    indices: torch.Tensor
    proxies: torch.Tensor
    pool: torch.Tensor
    picked: torch.Tensor
    seconds: float


def select_proxies(
    embed: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    current: torch.Tensor | None,
    b: int,
    generator: torch.Generator,
    proxies_per_class: int | None = None,
    small_budget: str = "times_p",
    normalize: bool = False,
    zero_seeds: bool = False,
    num_classes: int | None = None,
) -> KCenterSelection:
    """GreedyKCenterProxy(ρ*, b, f(·; θ*)) of Alg. 2 for every class.

    Args:
        embed: maps a 1-D LongTensor of dataset indices to their (n, D) embeddings f(x; θ*) (the
            engine's job: chunking, train augmentation, BN in inference mode — ASAP-R6).
        labels: (N,) training labels in 0..C-1.
        current: (C, P, D) current proxies ρ* (the k-Center seeds), or None (no seeds).
        b: the pool budget; see :func:`pool_size`. b = 1 returns P random samples per class.
        proxies_per_class: P (taken from `current` when given).
        normalize: compare Lipschitz-normalised pool and centres (ASAP-R6; default raw).
        num_classes: C when `current` is None (default: max label + 1).
        zero_seeds: with `current=None`, seed every class with one all-zero centre (ASAP-R1 later code).
    """
    start = time.perf_counter()
    if current is not None:
        num_classes, P = current.shape[0], current.shape[1]
        if proxies_per_class not in (None, P):
            raise ValueError(f"select_proxies: proxies_per_class={proxies_per_class} but current has P={P}")
    else:
        if proxies_per_class is None:
            raise ValueError("select_proxies: give `current` proxies or `proxies_per_class`")
        P = proxies_per_class
        if num_classes is None:
            num_classes = int(torch.as_tensor(labels).max()) + 1
    if b < 1:
        raise ValueError(f"select_proxies: budget b must be >= 1, got {b}")
    n = pool_size(b, P, small_budget)
    pool = sample_pools(labels, num_classes, n, generator)
    with torch.no_grad():
        emb = embed(pool.flatten()).detach()
    emb = emb.reshape(num_classes, n, -1)
    if b == 1:  # random sampling (paper §4.3); the pool *is* the P random draws
        picked = torch.arange(P).expand(num_classes, P)
    else:
        seeds = current.detach().to(emb) if current is not None else None
        if seeds is None and zero_seeds:
            seeds = emb.new_zeros(num_classes, 1, emb.shape[-1])
        if normalize:
            picked = farthest_first(lipschitz_normalize(emb), P, None if seeds is None else lipschitz_normalize(seeds))
        else:
            picked = farthest_first(emb, P, seeds)
    picked = picked.to(pool.device)
    rows = torch.arange(num_classes).unsqueeze(1)
    indices = pool[rows, picked]
    proxies = emb[rows.to(emb.device), picked.to(emb.device)]
    return KCenterSelection(indices, proxies, pool, picked, time.perf_counter() - start)


def initial_proxies(
    embed: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    num_classes: int,
    proxies_per_class: int,
    b: int,
    generator: torch.Generator,
    first_init: str = "kcenter_from_random",
    small_budget: str = "times_p",
    normalize: bool = False,
) -> KCenterSelection:
    """The first proxies of Alg. 1 ("initialize ρ* with random samples", then GreedyKCenterProxy).

    `first_init` (ASAP-R1): ``"kcenter_from_random"`` (default) — ρ* = embeddings of P random samples per
    class, then k-Center seeded with ρ*; ``"random"`` — ρ* itself; ``"kcenter_from_zero"`` — k-Center
    seeded with all-zero proxies (later code).
    """
    if first_init not in FIRST_INIT:
        raise ValueError(f"initial_proxies: first_init must be one of {FIRST_INIT}, got {first_init!r}")
    P = proxies_per_class
    if first_init == "kcenter_from_zero":
        return select_proxies(
            embed, labels, None, b, generator, P, small_budget, normalize, zero_seeds=True, num_classes=num_classes
        )
    rand = select_proxies(embed, labels, None, 1, generator, P, num_classes=num_classes)
    if first_init == "random":
        return rand
    sel = select_proxies(embed, labels, rand.proxies, b, generator, P, small_budget, normalize)
    sel.seconds += rand.seconds
    return sel


def covering_radius(points: torch.Tensor, centers: torch.Tensor) -> float:
    """max_x min_c ‖x − c‖ over (n, D) points and (m, D) centres (the δ of Prop. 4.1/4.2)."""
    return float(_distances(points.unsqueeze(0), centers.unsqueeze(0))[0].amin(-1).amax())


def mean_class_covering_radius(embeddings: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor) -> float:
    """Mean over classes of the covering radius of class c's samples by its proxies (C, P, D)
    (an optional per-projection diagnostic: Prop. 4.2's covering radius)."""
    labels = torch.as_tensor(labels).long()
    radii = [
        covering_radius(embeddings[labels == c], proxies[c])
        for c in range(proxies.shape[0])
        if bool((labels == c).any())
    ]
    return float(sum(radii) / len(radii)) if radii else float("nan")
