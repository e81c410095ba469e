"""Neighbour list of different-class point pairs that may lie within a cut-off radius.

PFML's proxy–proxy energy (eq. 6) is O((N·M)²), but a different-class pair farther apart than
δ_rep contributes the constant ψ_rep(δ_rep) with zero gradient (eq. 2). Only near pairs matter,
so we keep a Verlet list (as in molecular dynamics) refreshed per point:

* every point a has a reference position R_a, where it was when its row was last searched;
* the list holds every different-class pair with ‖R_a − R_b‖ < radius + 2·skin;
* gap_a is a lower bound on ‖R_a − R_b‖ over the different-class b *not* in the list;
* point a may move (gap_a − radius)/2 ≥ skin away from R_a; beyond that its row is searched
  again against all current references (cost: rows × N·M × D, one GEMM in the search precision,
  `search_precision.py`, giving each pair a lower bound on its squared distance, `distances.SearchBound`).
  When more than half of the rows are due, every row is searched instead, each pair once (rows
  against the columns from their own index on): half the pairs' work.

Why it is exact: a pair (a, b) outside the list was last measured between the current R_a and R_b
(a new reference re-measures every pair of its point), so ‖R_a − R_b‖ ≥ max(gap_a, gap_b), and
‖p_a − p_b‖ ≥ ‖R_a − R_b‖ − (gap_a − r)/2 − (gap_b − r)/2 ≥ r. The list is thus a superset of the
near pairs whatever the optimiser did. The allowances must hold with the gaps *after* the refresh:
a row searched at its new position lowers the gaps of the rows it passes near, so a point that was
within its old allowance may now be due; a call refreshes again until no row is due. A point far
from every other class may travel far before its row is searched again. `stats` records the work
done at the last call (`rows_refreshed`: over all its passes).

`pairs(..., max_pairs=K)` gives up (returns None and forgets the list) as soon as the list would hold
more than K pairs: its memory is then spent before the pairs are even gathered (PFML 64-d on SOP at
initialisation: every one of the 2.6e8 proxy pairs is near), and the caller evaluates all pairs instead.
"""

from __future__ import annotations

import torch

from .distances import search_bound, search_columns, search_rows, squared_distance_lower_bounds
from .search_precision import input_roundoff, search_dtype_on


class NeighbourList:
    def __init__(self, radius: float, skin: float, chunk_rows: int = 2048, search_dtype: torch.dtype | None = None):
        if radius <= 0 or skin < 0:
            raise ValueError(f"NeighbourList needs radius > 0 and skin >= 0, got radius={radius}, skin={skin}")
        self.radius, self.skin, self.chunk_rows, self.search_dtype = (
            float(radius),
            float(skin),
            int(chunk_rows),
            search_dtype,
        )
        self.reference: torch.Tensor | None = None
        self.gap = self.first = self.second = self.columns = self.bound = None
        self.stats = {"rows_refreshed": 0, "pairs": 0, "rebuilds": 0}

    def pairs(
        self, points: torch.Tensor, labels: torch.Tensor, max_pairs: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Unordered pairs (i < j) containing every different-class pair closer than `radius`.

        `labels` are the points' classes, fixed between calls, with each class's points in one
        contiguous block of rows (the proxies' layout: row j·M + k is proxy k of class j).
        None when the list would hold more than `max_pairs` pairs (the next call rebuilds it).
        """
        points = points.detach().float()
        n, dtype = points.shape[0], self.search_dtype or search_dtype_on(points.device)
        bound = search_bound(points.shape[1], dtype, input_roundoff(dtype, points.device))
        if (
            self.reference is None
            or self.reference.shape != points.shape
            or self.reference.device != points.device
            or bound != self.bound
        ):
            self.reference, self.bound = points.clone(), bound  # a new device or matmul precision: a new bound
            self.columns = search_columns(self.reference, bound)
            self.gap = torch.full((n,), float("inf"), device=points.device)
            self.first = self.second = torch.empty(0, dtype=torch.long, device=points.device)
            rows = torch.arange(n, device=points.device)
            self.stats["rebuilds"] += 1
        else:
            rows = self._due(points)
        refreshed = 0
        while rows.numel():  # a new reference lowers other rows' gaps, which may make them due too
            refreshed += int(rows.numel())
            if not self._refresh(points, labels, rows, max_pairs):
                self.reset()
                self.stats.update(rows_refreshed=refreshed, pairs=-1)
                return None
            rows = self._due(points)
        self.stats["rows_refreshed"] = refreshed
        self.stats["pairs"] = int(self.first.numel())
        return self.first, self.second

    def _due(self, points: torch.Tensor) -> torch.Tensor:
        """The rows whose point moved farther from its reference than its allowance (every row when
        more than half are due: cheaper to search each pair once)."""
        moved = torch.linalg.vector_norm(points - self.reference, dim=-1)
        allowance = ((self.gap - self.radius) / 2).clamp_min(self.skin) * (1 - 1e-4)
        rows = torch.nonzero(moved > allowance).flatten()
        return torch.arange(points.shape[0], device=points.device) if rows.numel() > points.shape[0] // 2 else rows

    def reset(self) -> None:
        """Forget the list: the next call searches every row."""
        self.reference = self.columns = None

    def _refresh(self, points: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor, max_pairs: int | None) -> bool:
        n, device, bound = points.shape[0], points.device, self.bound
        every_row = rows.numel() == n  # then each chunk meets only the columns from its first row on
        self.reference[rows] = points[rows]
        self.columns[rows] = search_columns(points[rows], bound)
        in_rows = torch.zeros(n, dtype=torch.bool, device=device)
        in_rows[rows] = True
        keep = ~(in_rows[self.first] | in_rows[self.second])
        firsts, seconds = [self.first[keep]], [self.second[keep]]
        held = int(keep.sum())
        self.gap[rows] = float("inf")
        threshold = bound.threshold((self.radius + 2.0 * self.skin) ** 2)
        class_start = torch.searchsorted(labels, labels, side="left")  # first row of each row's class
        class_size = torch.searchsorted(labels, labels, side="right") - class_start
        for start in range(0, rows.numel(), self.chunk_rows):
            chunk = rows[start : start + self.chunk_rows]
            offset = int(chunk[0]) if every_row else 0
            x = squared_distance_lower_bounds(search_rows(self.reference[chunk], bound), self.columns[offset:])
            own = int(class_size[chunk].max())  # same-class pairs are evaluated separately
            r = torch.arange(len(chunk), device=device)[:, None].expand(-1, own)
            c = class_start[chunk][:, None] + torch.arange(own, device=device)[None, :]
            valid = (c < class_start[chunk][:, None] + class_size[chunk][:, None]) & (c >= offset)
            x[r[valid], c[valid] - offset] = float("inf")
            row_min = x.amin(1)
            hot = torch.nonzero(row_min < threshold).flatten()  # the rows with candidates
            if hot.numel():
                near = x[hot] < threshold
                held += int(torch.count_nonzero(near))  # an upper bound on the pairs kept
                if max_pairs is not None and held > max_pairs:
                    return False
                ri, ci = torch.nonzero(near, as_tuple=True)
                ri = hot[ri]
                a, b = chunk[ri], ci + offset
                once = ~in_rows[b] | (a < b)  # a pair of two searched rows is kept from its smaller index
                firsts.append(torch.minimum(a[once], b[once]))
                seconds.append(torch.maximum(a[once], b[once]))
                x[ri, ci] = float("inf")  # the gaps bound the pairs left out
                row_min[hot] = x[hot].amin(1)
            # lower bounds on the distances of the pairs left out, for the per-point allowance
            self.gap[chunk] = torch.minimum(self.gap[chunk], bound.distance_lower_bound(row_min))
            self.gap[offset:] = torch.minimum(self.gap[offset:], bound.distance_lower_bound(x.amin(0)))
        self.first, self.second = torch.cat(firsts), torch.cat(seconds)
        return True
