"""Neighbour list of different-class point pairs that may lie within a cut-off radius.

PFML's proxy–proxy energy (eq. 6) is O((N·M)²), but a different-class pair farther apart than
δ_rep contributes the constant ψ_rep(δ_rep) with zero gradient (eq. 2). Only near pairs matter,
so we keep a Verlet list (as in molecular dynamics) refreshed per point:

* every point a has a reference position R_a, where it was when its row was last searched;
* the list holds every different-class pair with ‖R_a − R_b‖ < radius + 2·skin;
* gap_a is a lower bound on ‖R_a − R_b‖ over the different-class b *not* in the list;
* point a may move (gap_a − radius)/2 ≥ skin away from R_a; beyond that its row is searched
  again against all current references (cost: rows × N·M × D, one low-precision GEMM).

Why it is exact: a pair (a, b) outside the list was last measured between the current R_a and R_b
(a new reference re-measures every pair of its point), so ‖R_a − R_b‖ ≥ max(gap_a, gap_b), and
‖p_a − p_b‖ ≥ ‖R_a − R_b‖ − (gap_a − r)/2 − (gap_b − r)/2 ≥ r. The list is thus a superset of the
near pairs whatever the optimiser did. A point far from every other class may travel far before
its row is searched again. `stats` records the work done at the last call.

`pairs(..., max_pairs=K)` gives up (returns None and forgets the list) as soon as the list would hold
more than K pairs: its memory is then spent before the pairs are even gathered (PFML 64-d on SOP at
initialisation: every one of the 2.6e8 proxy pairs is near), and the caller evaluates all pairs instead.
"""

from __future__ import annotations

import torch

from .distances import lowp_rounding_bound, lowp_threshold, shifted_cross_lowp


class NeighbourList:
    def __init__(self, radius: float, skin: float, chunk_rows: int = 2048, search_dtype=torch.bfloat16):
        if radius <= 0 or skin < 0:
            raise ValueError(f"NeighbourList needs radius > 0 and skin >= 0, got radius={radius}, skin={skin}")
        self.radius, self.skin, self.chunk_rows, self.search_dtype = float(radius), float(skin), int(chunk_rows), search_dtype
        self.reference: torch.Tensor | None = None
        self.gap = self.first = self.second = None
        self.stats = {"rows_refreshed": 0, "pairs": 0, "rebuilds": 0}

    def pairs(self, points: torch.Tensor, labels: torch.Tensor,
              max_pairs: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Unordered pairs (i < j) containing every different-class pair closer than `radius`.

        `labels` are the points' classes, fixed between calls, with each class's points in one
        contiguous block of rows (the proxies' layout: row j·M + k is proxy k of class j).
        None when the list would hold more than `max_pairs` pairs (the next call rebuilds it).
        """
        points = points.detach()
        if self.reference is None or self.reference.shape != points.shape or self.reference.device != points.device:
            n = points.shape[0]
            self.reference = points.float().clone()
            self.gap = torch.full((n,), float("inf"), device=points.device)
            self.first = self.second = torch.empty(0, dtype=torch.long, device=points.device)
            rows = torch.arange(n, device=points.device)
            self.stats["rebuilds"] += 1
        else:
            moved = torch.linalg.vector_norm(points.float() - self.reference, dim=-1)
            allowance = ((self.gap - self.radius) / 2).clamp_min(self.skin) * (1 - 1e-4)
            rows = torch.nonzero(moved > allowance).flatten()
        if rows.numel() and not self._refresh(points.float(), labels, rows, max_pairs):
            self.reset()
            self.stats.update(rows_refreshed=int(rows.numel()), pairs=-1)
            return None
        self.stats["rows_refreshed"] = int(rows.numel())
        self.stats["pairs"] = int(self.first.numel())
        return self.first, self.second

    def reset(self) -> None:
        """Forget the list: the next call searches every row."""
        self.reference = None

    def _refresh(self, points: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor, max_pairs: int | None) -> bool:
        n, device = points.shape[0], points.device
        self.reference[rows] = points[rows]
        in_rows = torch.zeros(n, dtype=torch.bool, device=device)
        in_rows[rows] = True
        keep = ~(in_rows[self.first] | in_rows[self.second])
        firsts, seconds = [self.first[keep]], [self.second[keep]]
        held = int(keep.sum())
        self.gap[rows] = float("inf")
        sq_norms = torch.linalg.vector_norm(self.reference, dim=-1).square()
        max_norm = float(sq_norms.max().sqrt())
        u = torch.finfo(self.search_dtype).eps / 2
        bound = lowp_rounding_bound(max_norm, max_norm, points.shape[1], self.search_dtype)
        column_bound = bound + 1.5 * u * (max_norm ** 2 + (2 * max_norm) ** 2)  # rounding ‖R_i‖² and the sum
        reach2 = (self.radius + 2.0 * self.skin) ** 2
        class_start = torch.searchsorted(labels, labels, side="left")  # first row of each row's class
        class_size = torch.searchsorted(labels, labels, side="right") - class_start
        for start in range(0, rows.numel(), self.chunk_rows):
            chunk = rows[start:start + self.chunk_rows]
            # x[i, j] = ‖R_j‖² − 2 R_i·R_j, so ‖R_i − R_j‖² = x[i, j] + ‖R_i‖²
            x = shifted_cross_lowp(self.reference[chunk], self.reference, sq_norms, self.search_dtype)
            own = class_size[chunk].max()
            r = torch.arange(len(chunk), device=device)[:, None].expand(-1, int(own))
            c = class_start[chunk][:, None] + torch.arange(int(own), device=device)[None, :]
            valid = c < class_start[chunk][:, None] + class_size[chunk][:, None]
            x[r[valid], c[valid]] = float("inf")  # same-class pairs are evaluated separately
            row_sq = sq_norms[chunk]
            near = x < lowp_threshold(reach2 + bound - row_sq, x.dtype)[:, None]
            held += int(near.sum())  # an upper bound on the pairs kept (pairs of two refreshed rows count twice)
            if max_pairs is not None and held > max_pairs:
                return False
            ri, ci = torch.nonzero(near, as_tuple=True)
            a = chunk[ri]
            once = ~in_rows[ci] | (a < ci)  # a pair of two refreshed rows is kept from its smaller index
            firsts.append(torch.minimum(a[once], ci[once]))
            seconds.append(torch.maximum(a[once], ci[once]))
            # lower bounds on the distances of the pairs left out, for the per-point allowance
            x.masked_fill_(near, float("inf"))
            self.gap[chunk] = (x.amin(1).float() + row_sq - bound).clamp_min(0).sqrt()
            column_d2 = torch.add(x, row_sq.to(x.dtype)[:, None]).amin(0).float()
            self.gap = torch.minimum(self.gap, (column_d2 - column_bound).clamp_min(0).sqrt())
        self.first, self.second = torch.cat(firsts), torch.cat(seconds)
        return True
