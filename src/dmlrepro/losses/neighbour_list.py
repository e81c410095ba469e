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
"""

from __future__ import annotations

import torch

from .distances import squared_distances_lowp


class NeighbourList:
    def __init__(self, radius: float, skin: float, chunk_rows: int = 2048, search_dtype=torch.bfloat16):
        if radius <= 0 or skin < 0:
            raise ValueError(f"NeighbourList needs radius > 0 and skin >= 0, got radius={radius}, skin={skin}")
        self.radius, self.skin, self.chunk_rows, self.search_dtype = float(radius), float(skin), int(chunk_rows), search_dtype
        self.reference: torch.Tensor | None = None
        self.gap = self.first = self.second = None
        self.stats = {"rows_refreshed": 0, "pairs": 0, "rebuilds": 0}

    def pairs(self, points: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unordered pairs (i < j) containing every different-class pair closer than `radius`.

        `labels` must stay the same between calls (they are the proxies' fixed classes).
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
            moved2 = (points.float() - self.reference).pow(2).sum(-1)
            allowance = ((self.gap - self.radius) / 2).clamp_min(self.skin) * (1 - 1e-4)
            rows = torch.nonzero(moved2 > allowance * allowance).flatten()
        if rows.numel():
            self._refresh(points.float(), labels, rows)
        self.stats["rows_refreshed"] = int(rows.numel())
        self.stats["pairs"] = int(self.first.numel())
        return self.first, self.second

    def _refresh(self, points: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor) -> None:
        n = points.shape[0]
        self.reference[rows] = points[rows]
        in_rows = torch.zeros(n, dtype=torch.bool, device=points.device)
        in_rows[rows] = True
        keep = ~(in_rows[self.first] | in_rows[self.second])
        firsts, seconds = [self.first[keep]], [self.second[keep]]
        self.gap[rows] = float("inf")
        reach2 = (self.radius + 2.0 * self.skin) ** 2
        for start in range(0, rows.numel(), self.chunk_rows):
            chunk = rows[start:start + self.chunk_rows]
            d2, bound = squared_distances_lowp(self.reference[chunk], self.reference, self.search_dtype)
            same_r, same_c = torch.nonzero(labels[chunk, None] == labels[None, :], as_tuple=True)
            d2[same_r, same_c] = float("inf")  # same-class pairs are evaluated separately
            near = d2 < reach2 + bound
            r, c = torch.nonzero(near, as_tuple=True)
            a = chunk[r]
            once = ~in_rows[c] | (a < c)  # a pair of two refreshed rows is kept from its smaller index
            firsts.append(torch.minimum(a[once], c[once]))
            seconds.append(torch.maximum(a[once], c[once]))
            # lower bounds on the distances of the pairs left out, for the per-point allowance
            d2.masked_fill_(near, float("inf"))
            self.gap[chunk] = (d2.amin(1) - bound).clamp_min(0).sqrt()
            self.gap = torch.minimum(self.gap, (d2.amin(0) - bound).clamp_min(0).sqrt())
        self.first, self.second = torch.cat(firsts), torch.cat(seconds)
