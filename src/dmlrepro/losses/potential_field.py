"""Total potential energy of samples and proxies, PFML eq. (3)–(6), for any pair potential.

PFML (`pfml.py`) and its contrastive twin CPML (`cpml.py`) differ only in the single-point
potentials ψ_att, ψ_rep; everything here is shared. Stacking the B batch embeddings and the N·M
proxies into one set of points, eq. (6) is the sum over ordered pairs a ≠ b of
φ_ab = ψ_att(d_ab) for same-class pairs and ψ_rep(d_ab) otherwise (docs/readings/pfml.md#pfml-r2):

    U = U_zz + 2·U_zp + U_pp

(the constant self terms ψ_att(0) are left out; they carry no gradient).

Both potentials are constant beyond their δ: a different-class pair farther apart than δ_rep adds
ψ_rep(δ_rep) and no gradient. With `pair_search="neighbour"` (and "auto" on large blocks) the different-class terms are
therefore evaluated as (count · ψ_rep(δ_rep)) + Σ_near (ψ_rep(d) − ψ_rep(δ_rep)), where the near
pairs come from a no-grad search (sample–proxy) and a Verlet neighbour list (proxy–proxy). The
value and gradients equal the dense evaluation up to floating-point rounding.

When the near proxy pairs are too many for a list (`pair_memory_budget`; PFML 64-d on SOP at
initialisation: all of them), or an (n, n) matrix too large, the proxy–proxy sum runs over every pair
in chunks of rows (`chunked_pair_sum`, memory O(rows · n)); the path taken depends only on the current
proxies (the near pairs counted now) and the device's total memory, so a resumed run takes the same one —
unless a list kept from earlier steps overflows on candidates (within δ_rep + 2·skin) that a fresh list would not hold.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .base import check_embeddings, full_precision
from .distances import (
    paired_distances,
    pairwise_distances,
    search_bound,
    search_columns,
    search_rows,
    self_distances,
    squared_distance_lower_bounds,
)
from .neighbour_list import NeighbourList
from .registry import Proxies
from .search_precision import input_roundoff, search_dtype_on

PAIR_SEARCH_MODES = ("auto", "dense", "neighbour")
# "auto" evaluates a block densely up to this many pairs; beyond, near pairs only, which is faster on a CPU
# (docs/benchmarks.md#measurements-behind-code-choices-cpu)
DENSE_PROXY_PAIRS = 2**14
DENSE_SAMPLE_PROXY_PAIRS = 2**14
# on an accelerator "auto" is dense while a block's pair matrices (distances, potentials and their gradients,
# DENSE_BYTES_PER_PAIR each pair nominally; the float32 forward + backward peaked at 28-29 bytes per pair,
# docs/losses.md) fit 1/DENSE_GPU_MEMORY_SHARE of the device's memory, at least DENSE_GPU_BYTES: there the
# CPU limits above do not apply
DENSE_GPU_BYTES = 2**28
DENSE_GPU_MEMORY_SHARE = 8
DENSE_BYTES_PER_PAIR = 16
PAIR_CHUNK = 2**16  # beyond this many near proxy pairs, evaluate them in checkpointed chunks (memory O(chunk·D))
# memory the proxy–proxy block may take: beyond it the full matrix is evaluated in row chunks, and a
# neighbour list that would hold more than PAIR_MEMORY_BYTES / LISTED_PAIR_BYTES pairs gives way to that chunked
# pass (PFML 64-d on SOP at initialisation: all 2.6e8 proxy pairs lie within δ_rep)
PAIR_MEMORY_BYTES = 2**28
LISTED_PAIR_BYTES = 64  # indices, candidate masks and the gathered rows' distances of one listed pair
CHUNK_BYTES_PER_PAIR = 64  # the few (chunk, n) matrices of one row chunk, in float64, with their gradients


def pair_memory_budget(device_type: str, total_memory: int | None) -> int:
    """Bytes the proxy–proxy block (dense matrix, listed pairs or one row chunk) and "auto"'s dense blocks
    may take: PAIR_MEMORY_BYTES on the CPU; on an accelerator a share of its memory, at least DENSE_GPU_BYTES."""
    if device_type == "cpu" or not total_memory:
        return PAIR_MEMORY_BYTES
    return max(DENSE_GPU_BYTES, total_memory // DENSE_GPU_MEMORY_SHARE)


@functools.cache
def device_memory(device: torch.device) -> int | None:
    """Total memory of a CUDA device (its MIG slice under MIG), asked once per process; None elsewhere.

    The total, not the free memory: the path a step takes must not depend on what else is allocated,
    so that a resumed run on the same kind of device takes the same one."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[1])


def memory_budget(device: torch.device) -> int:
    return pair_memory_budget(device.type, device_memory(device))


class _PrecomputedGradient(torch.autograd.Function):
    """`value` with the gradient d value / d x already computed (first order; the chunked pass below)."""

    @staticmethod
    def forward(ctx, x, value, gradient):
        ctx.save_for_backward(gradient)
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        (gradient,) = ctx.saved_tensors
        return grad_output * gradient, None, None


def chunked_pair_sum(q: torch.Tensor, pair_sum, rows: int) -> torch.Tensor:
    """Σ over row chunks of `pair_sum(q, start, stop)` (a scalar over the pairs of rows start:stop with
    all of q) and its exact gradient, holding one chunk's (rows, n) matrices at a time: each chunk's
    graph is built, differentiated and freed before the next (memory O(rows · n), not O(n²))."""
    n, total = q.shape[0], q.new_zeros(())
    if not (torch.is_grad_enabled() and q.requires_grad):
        with torch.no_grad():
            for start in range(0, n, rows):
                total = total + pair_sum(q, start, min(start + rows, n))
        return total
    gradient = torch.zeros_like(q)
    for start in range(0, n, rows):
        leaf = q.detach().requires_grad_()
        with torch.enable_grad():
            value = pair_sum(leaf, start, min(start + rows, n))
            (g,) = torch.autograd.grad(value, leaf)
        total, gradient = total + value.detach(), gradient + g
    return _PrecomputedGradient.apply(q, total, gradient)


def within(points: torch.Tensor, first: torch.Tensor, second: torch.Tensor, radius: float, chunk: int = PAIR_CHUNK):
    """The candidate pairs that are closer than `radius` now (plus a rounding margin), without autograd.

    Pairs beyond the radius add exactly the far-field constant and no gradient, so dropping them
    keeps the energy exact while the autograd graph only spans the pairs that matter."""
    with torch.no_grad():
        keep = [
            paired_distances(points[first[s : s + chunk]], points[second[s : s + chunk]]) < radius * (1 + 1e-5)
            for s in range(0, first.numel(), chunk)
        ]
    if not keep:
        return first, second
    keep = torch.cat(keep)
    return first[keep], second[keep]


class PotentialFieldLoss(nn.Module):
    """Energy U of eq. (6) over a batch and all class proxies; subclasses define ψ_att and ψ_rep.

    Args:
        num_classes: N, the number of training classes (proxies exist for all of them).
        embedding_size: D.
        proxies_per_class: M; 0 is the no-proxy ablation (U = Σ_i Ψ_{y_i}(z_i), Fig. 3a).
        delta: δ_att, the attraction radius of eq. (1).
        delta_rep: δ_rep of eq. (2); None means δ_rep = δ_att (the main method).
        reduction: "sum" (U itself) or "mean" (U / (B + N·M)).
        normalize_proxies: use ℓ2-normalised proxies in the distances (PFML-R5; default off).
        proxy_init: "normal" (i.i.d. Gaussian, std `proxy_init_std`, default √(2/N)) or
            "unit_sphere" (the Gaussian draw normalised once).
        pair_search: "dense" (every pair), "neighbour" (near pairs only, exact), or "auto"
            (near pairs only in blocks of more than 2^14 pairs on the CPU; on a GPU in blocks whose
            pair matrices would take more than 1/8 of its memory, `pair_memory_budget`).
        skin: least distance a proxy may move before its neighbour-list row is searched again;
            None means δ_rep / 10 (see `neighbour_list.py`; measured in docs/losses.md).
        search_dtype: precision of the no-grad near-pair searches' GEMM; None (default) picks it per
            device (`search_precision.py`: bfloat16 on CPUs with native bfloat16, float32 elsewhere).
            Rounding is bounded, so the pairs, and the loss, are the same whatever the precision.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        proxies_per_class: int,
        delta: float,
        delta_rep: float | None = None,
        reduction: str = "sum",
        normalize_proxies: bool = False,
        proxy_init: str = "normal",
        proxy_init_std: float | None = None,
        pair_search: str = "auto",
        skin: float | None = None,
        search_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if num_classes < 1 or embedding_size < 1 or proxies_per_class < 0:
            raise ValueError(
                f"{type(self).__name__}: need num_classes >= 1, embedding_size >= 1 and "
                f"proxies_per_class >= 0, got {num_classes}, {embedding_size}, {proxies_per_class}"
            )
        if delta <= 0 or (delta_rep is not None and delta_rep <= 0):
            raise ValueError(f"{type(self).__name__}: delta and delta_rep must be > 0, got {delta}, {delta_rep}")
        if reduction not in ("sum", "mean"):
            raise ValueError(f"{type(self).__name__}: reduction must be 'sum' or 'mean', got {reduction!r}")
        if pair_search not in PAIR_SEARCH_MODES:
            raise ValueError(
                f"{type(self).__name__}: pair_search must be one of {PAIR_SEARCH_MODES}, got {pair_search!r}"
            )
        self.num_classes, self.embedding_size, self.proxies_per_class = num_classes, embedding_size, proxies_per_class
        self.delta_att = float(delta)
        self.delta_rep = float(delta if delta_rep is None else delta_rep)
        self.reduction, self.normalize_proxies, self.pair_search = reduction, normalize_proxies, pair_search
        self.proxies = nn.Parameter(self._initial_proxies(proxy_init, proxy_init_std))
        self.register_buffer(
            "proxy_labels", torch.arange(num_classes).repeat_interleave(proxies_per_class), persistent=False
        )
        self.search_dtype = search_dtype
        self._neighbours = NeighbourList(
            self.delta_rep, self.delta_rep / 10 if skin is None else skin, search_dtype=search_dtype
        )
        self.pair_path = None  # how the last call evaluated the proxy–proxy block: "dense", "neighbour", "chunked"
        self._paths_taken: set[str] = set()  # "dense" / "neighbour_list" per different-class block, every call
        self._listed_pairs_fit = True

    def _initial_proxies(self, proxy_init: str, std: float | None) -> torch.Tensor:
        # i.i.d. Gaussian (supp. §2, Cor. 1 proof), std √(2/N) by default (PFML-R6)
        p = torch.randn(self.num_classes * self.proxies_per_class, self.embedding_size)
        if proxy_init == "normal":
            return p * (math.sqrt(2.0 / self.num_classes) if std is None else std)
        if proxy_init == "unit_sphere":
            return F.normalize(p, dim=-1)
        raise ValueError(f"{type(self).__name__}: proxy_init must be 'normal' or 'unit_sphere', got {proxy_init!r}")

    # -- the pair potentials: ψ_att for same-class pairs, ψ_rep (constant beyond δ_rep) otherwise --
    def attraction(self, d: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def repulsion(self, d: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _sparse(self, pairs: int, dense_limit: int, device: torch.device | None = None) -> bool:
        if self.pair_search == "auto":
            if device is not None and device.type != "cpu":  # by memory budget on an accelerator
                return pairs * DENSE_BYTES_PER_PAIR > memory_budget(device)
            return pairs > dense_limit
        return self.pair_search == "neighbour"

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_embeddings(self, embeddings, self.embedding_size)
        with full_precision(embeddings) as dtype:  # energies in fp32 at least (PFML-R7)
            z, y = embeddings.to(dtype), labels.to(embeddings.device).long()
            q = self.proxies.to(dtype)
            if self.normalize_proxies:
                q = F.normalize(q, dim=-1)
            far = self.repulsion(torch.tensor(self.delta_rep, dtype=dtype, device=z.device))
            u_zz = self._sample_sample(z, y)
            u_zp, u_pp = z.new_zeros(()), z.new_zeros(())
            if q.shape[0]:
                u_pp = self._same_class_proxies(q)
                sparse_zp = self._sparse(len(z) * q.shape[0], DENSE_SAMPLE_PROXY_PAIRS, z.device)
                sparse_pp = self._sparse(q.shape[0] ** 2, DENSE_PROXY_PAIRS, z.device)
                if not sparse_zp:
                    u_zp = self._pair_potential(
                        pairwise_distances(z, q), y[:, None] == self.proxy_labels[None, :]
                    ).sum()
                pairs, tried = None, sparse_pp and self._listed_pairs_fit
                if tried:  # None: too many near pairs for the list's memory
                    pairs = self._near_proxy_pairs(q)
                if not sparse_pp or pairs is None:
                    pp_all = self._different_class_proxies(q)
                    if sparse_pp and not tried and self._listed_pairs_fit:
                        # the near pairs fit again: the list's sum, as a fresh start here would take
                        pairs = self._near_proxy_pairs(q)
                    u_pp = u_pp + (pp_all if pairs is None else 0.0)
                if sparse_zp or pairs is not None:
                    zp, pp = self._near_terms(z, y, q, far, sparse_zp, pairs)
                    u_zp, u_pp = u_zp + zp, u_pp + pp
                self._paths_taken |= {"neighbour_list" if near else "dense" for near in (sparse_zp, pairs is not None)}
            energy = u_zz + 2.0 * u_zp + u_pp  # eq. (6): each sample–proxy pair appears in both fields
            if self.reduction == "mean":
                energy = energy / (z.shape[0] + q.shape[0])
        return energy

    def _pair_potential(self, d: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
        return torch.where(same, self.attraction(d), self.repulsion(d))

    def _sample_sample(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        phi = self._pair_potential(self_distances(z), y[:, None] == y[None, :])
        return phi.masked_fill(torch.eye(len(z), dtype=torch.bool, device=z.device), 0.0).sum()

    def _same_class_proxies(self, q: torch.Tensor) -> torch.Tensor:
        """Σ ψ_att over ordered pairs of distinct proxies of one class (the same-class part of U_pp)."""
        m = self.proxies_per_class
        per_class = q.view(self.num_classes, m, -1)
        if m <= 3:  # few pairs per class: differences are cheaper than N tiny Gram matrices
            # views of the k-th proxies (unbind: a light backward, no scatter into a zero buffer)
            kth, pairs = per_class.unbind(1), list(itertools.combinations(range(m), 2))
            if not pairs:
                return q.new_zeros(())
            first, second = (torch.stack([kth[pair[side]] for pair in pairs]) for side in (0, 1))
            return 2.0 * self.attraction(paired_distances(first, second)).sum()
        off_diagonal = ~torch.eye(m, dtype=torch.bool, device=q.device)
        return self.attraction(self_distances(per_class)[:, off_diagonal]).sum()

    def _different_class_proxies(self, q: torch.Tensor) -> torch.Tensor:
        """Σ ψ_rep over ordered different-class proxy pairs, from every pair: one (n, n) matrix while it
        fits the device's `pair_memory_budget`, else chunks of rows (`chunked_pair_sum`; same sum, bounded memory)."""
        n, labels, budget = q.shape[0], self.proxy_labels, memory_budget(q.device)
        if n * n * DENSE_BYTES_PER_PAIR <= budget:
            self.pair_path = "dense"
            return torch.where(labels[:, None] != labels[None, :], self.repulsion(self_distances(q)), 0.0).sum()
        near = []

        def rows_sum(points, start, stop):  # rows start:stop against columns start:, each pair once
            d = pairwise_distances(points[start:stop], points[start:])
            diff = labels[start:stop, None] != labels[None, start:]
            with torch.no_grad():  # for the choice of path at the next call
                close = diff & (d < self.delta_rep * (1 + 1e-5))
                near.append(int(close[:, stop - start :].sum()) + int(close[:, : stop - start].sum()) // 2)
            phi = torch.where(diff, self.repulsion(d), 0.0)
            # ordered pairs: the (rows, rows) block holds both orders, the columns beyond it one
            return phi[:, : stop - start].sum() + 2.0 * phi[:, stop - start :].sum()

        self.pair_path = "chunked"
        total = chunked_pair_sum(q, rows_sum, max(1, budget // (n * CHUNK_BYTES_PER_PAIR)))
        # the neighbour list is tried again once the near pairs would fit it
        self._listed_pairs_fit = sum(near) <= budget // LISTED_PAIR_BYTES
        return total

    def _near_proxy_pairs(self, q: torch.Tensor):
        """The different-class proxy pairs within δ_rep now, in a canonical order; None beyond the memory budget."""
        budget = memory_budget(q.device)
        listed = self._neighbours.pairs(q, self.proxy_labels, max_pairs=2 * budget // LISTED_PAIR_BYTES)
        if listed is None:
            self._listed_pairs_fit = False
            return None
        first, second = within(q, *listed, self.delta_rep)
        if len(first) > budget // LISTED_PAIR_BYTES:
            self._neighbours.reset()  # rebuilt from the positions of its next use, as on a fresh start
            self._listed_pairs_fit = False
            return None
        # a canonical order: the sum must not depend on the list's history (bit-exact resume)
        order = torch.argsort(first * q.shape[0] + second)
        self.pair_path = "neighbour"
        return first[order], second[order]

    def _near_terms(self, z, y, q, far, sparse_zp: bool, pairs):
        """U_zp and the different-class part of U_pp from the near pairs only (module docstring).

        The pairs are found without autograd; the proxies they involve are gathered in one
        index_select so that backward scatters into a single (N·M, D) gradient buffer."""
        m, labels = self.proxies_per_class, self.proxy_labels
        empty = torch.empty(0, dtype=torch.long, device=q.device)
        own = i = a = first = second = empty
        if sparse_zp:
            own = (y[:, None] * m + torch.arange(m, device=q.device)).flatten()  # each sample's class proxies
            with torch.no_grad():
                dtype = self.search_dtype or search_dtype_on(q.device)
                bound = search_bound(z.shape[1], dtype, input_roundoff(dtype, q.device))
                x = squared_distance_lower_bounds(search_rows(z, bound), search_columns(q, bound))
                near = x < bound.threshold(self.delta_rep**2)
                near &= y[:, None] != labels[None, :]
                i, a = torch.nonzero(near, as_tuple=True)
        sparse_pp = pairs is not None
        if sparse_pp:
            first, second = pairs
        chunked = len(first) > PAIR_CHUNK
        index = [own, a] if chunked else [own, a, first, second]
        rows = q.index_select(0, torch.cat(index)).split([len(ix) for ix in index])
        own_rows, a_rows = rows[0], rows[1]
        zp = pp = z.new_zeros(())
        if sparse_zp:
            same = self.attraction(paired_distances(z.repeat_interleave(m, dim=0), own_rows)).sum()
            n_far = z.shape[0] * (q.shape[0] - m)
            zp = same + n_far * far + (self.repulsion(paired_distances(z[i], a_rows)) - far).sum()
        if sparse_pp:
            n_ordered = q.shape[0] * (q.shape[0] - m)
            if chunked:  # recomputed in backward: only one chunk's gathered rows live at a time
                excess = sum(
                    checkpoint(
                        self._repulsion_excess,
                        q,
                        first[s : s + PAIR_CHUNK],
                        second[s : s + PAIR_CHUNK],
                        far,
                        use_reentrant=False,
                    )
                    for s in range(0, len(first), PAIR_CHUNK)
                )
            else:
                excess = (self.repulsion(paired_distances(rows[2], rows[3])) - far).sum()
            pp = n_ordered * far + 2.0 * excess
        return zp, pp

    def _repulsion_excess(self, q, first, second, far):
        return (self.repulsion(paired_distances(q[first], q[second])) - far).sum()

    @property
    def pair_search_path(self) -> str | None:
        """How the different-class pairs (sample–proxy, proxy–proxy) were evaluated over every call so far:
        "dense" (every pair, from full distance matrices, in row chunks or not), "neighbour_list" (near pairs
        only, `pair_search`), "mixed" (both), None before the first call with proxies. For metrics.json: the
        two paths agree up to float32 rounding (tests/losses/test_pfml_paths.py)."""
        if len(self._paths_taken) > 1:
            return "mixed"
        return next(iter(self._paths_taken), None)

    def get_extra_state(self) -> dict[str, list[str]]:
        """The paths taken so far travel with the loss's checkpoint: a resumed run records the same
        ``pair_search_path`` as an uninterrupted one (metrics.json byte-equal after a kill)."""
        return {"paths_taken": sorted(self._paths_taken)}

    def set_extra_state(self, state: dict[str, list[str]]) -> None:
        self._paths_taken = set(state["paths_taken"])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict.setdefault(prefix + "_extra_state", {"paths_taken": []})  # a checkpoint written before the record
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def neighbour_stats(self) -> dict[str, int]:
        """Rows refreshed and pairs held by the proxy–proxy neighbour list at the last forward."""
        return dict(self._neighbours.stats)

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, embedding_size={self.embedding_size}, "
            f"proxies_per_class={self.proxies_per_class}, delta_att={self.delta_att}, "
            f"delta_rep={self.delta_rep}, reduction={self.reduction!r}, pair_search={self.pair_search!r}"
        )


def _potential_field_space(points: torch.Tensor, loss: PotentialFieldLoss) -> torch.Tensor:
    return F.normalize(points, dim=-1) if loss.normalize_proxies else points


#: PFML's and CPML's proxies: M per class (0 for the no-proxy ablation), raw or ℓ2-normalised (PFML-R5)
POTENTIAL_FIELD_PROXIES = Proxies(
    tensor=lambda loss: loss.proxies, per_class=lambda loss: loss.proxies_per_class, space=_potential_field_space
)
