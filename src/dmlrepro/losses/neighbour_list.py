"""Neighbour list of different-class point pairs that may lie within a cut-off radius.

PFML's proxy–proxy energy (eq. 6) is O((N·M)²), but a different-class pair farther apart than
δ_rep contributes the constant ψ_rep(δ_rep) with zero gradient (eq. 2). Only near pairs matter,
so we keep a Verlet list (molecular dynamics) with a per-point refresh:

* every point a has a reference position R_a (where it was when its row was last searched);
* the list holds every different-class pair with ‖R_a − R_b‖ < radius + 2·skin;
* a point that has moved more than `skin` from R_a gets a new reference and its row is searched
  again against all current references (cost: rows × N·M × D, no autograd graph).

Invariant: for every pair (a, b) not in the list, its distance was last measured between the
current R_a and R_b (a new reference re-measures all pairs of that point), was ≥ radius + 2·skin,
and both points are within `skin` of their references, hence ‖p_a − p_b‖ ≥ radius now. So the
list is a superset of the near pairs whatever the optimiser did, and results are exact. The cost
is set by how many points move farther than `skin` per step; `stats` records it.
"""

from __future__ import annotations

import torch

from .distances import search_tolerance, squared_distances_nograd


class NeighbourList:
    def __init__(self, radius: float, skin: float, chunk_rows: int = 2048):
        if radius <= 0 or skin < 0:
            raise ValueError(f"NeighbourList needs radius > 0 and skin >= 0, got radius={radius}, skin={skin}")
        self.radius, self.skin, self.chunk_rows = float(radius), float(skin), int(chunk_rows)
        self.reference: torch.Tensor | None = None
        self.first = self.second = None  # unordered pairs, first < second
        self.stats = {"rows_refreshed": 0, "pairs": 0, "rebuilds": 0}

    def pairs(self, points: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Unordered pairs (i < j) containing every different-class pair closer than `radius`.

        `labels` must stay the same between calls (they are the proxies' fixed classes).
        """
        points = points.detach()
        if self.reference is None or self.reference.shape != points.shape or self.reference.device != points.device \
                or self.reference.dtype != points.dtype:
            self.reference = points.clone()
            empty = torch.empty(0, dtype=torch.long, device=points.device)
            self.first, self.second = empty, empty
            rows = torch.arange(points.shape[0], device=points.device)
            self.stats["rebuilds"] += 1
        else:
            moved2 = (points - self.reference).pow(2).sum(-1)
            rows = torch.nonzero(moved2 > (self.skin * (1 - 1e-4)) ** 2).flatten()
        if rows.numel():
            self._refresh(points, labels, rows)
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
        reach = self.radius + 2.0 * self.skin
        columns = torch.arange(n, device=points.device)
        for start in range(0, rows.numel(), self.chunk_rows):
            chunk = rows[start:start + self.chunk_rows]
            ref_chunk = self.reference[chunk]
            d2 = squared_distances_nograd(ref_chunk, self.reference)
            near = d2 < reach * reach + search_tolerance(ref_chunk, self.reference)
            near &= labels[chunk, None] != labels[None, :]
            # a pair of two refreshed rows is found once, from its smaller index
            near &= ~(in_rows[None, :] & (columns[None, :] <= chunk[:, None]))
            r, c = torch.nonzero(near, as_tuple=True)
            a, b = chunk[r], c
            firsts.append(torch.minimum(a, b))
            seconds.append(torch.maximum(a, b))
        self.first, self.second = torch.cat(firsts), torch.cat(seconds)
