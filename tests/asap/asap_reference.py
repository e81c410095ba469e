"""Independent float64 references for the ASAP modules, written literally from the paper's formulas
(scalar double loops, no vectorisation, nothing imported from dmlrepro)."""

from __future__ import annotations

import math

import torch


def lip(v):
    """𝒩(v) = v if ‖v‖ ≤ 1 else v/‖v‖ (paper §4.4), one vector."""
    n = torch.sqrt((v * v).sum())
    return v if float(n) <= 1.0 else v / n


def dist(a, b):
    return torch.sqrt(((a - b) ** 2).sum())


def dot(a, b):
    return (a * b).sum()


def farthest_first(pool, k, centers=()):
    """Alg. 2 for one class: q ← argmax_{u ∉ r} min_{v ∈ ρ ∪ r} ‖u − v‖ (lowest index on ties)."""
    chosen = []
    for _ in range(k):
        best, best_val = None, -math.inf
        for u in range(len(pool)):
            if u in chosen:
                continue
            refs = [c for c in centers] + [pool[j] for j in chosen]
            val = min(float(dist(pool[u], v)) for v in refs) if refs else math.inf
            if val > best_val:
                best, best_val = u, val
        chosen.append(best)
    return chosen


def _pairs(anchors, a_lab, refs, r_lab, exclude_self):
    """Yield (i, k, is_positive) over anchor/reference pairs."""
    for i in range(len(anchors)):
        for k in range(len(refs)):
            if exclude_self and i == k:
                continue
            yield i, k, int(a_lab[i]) == int(r_lab[k])


def c2(anchors, a_lab, refs, r_lab, m_pos, m_neg, exclude_self=False, reduction="nonzero"):
    """Generalized contrastive loss (ι(d − β) + α)_+ of eq. 4.2 with m± = β ∓ α."""
    beta, alpha = (m_pos + m_neg) / 2, (m_neg - m_pos) / 2
    pos, neg = [], []
    for i, k, same in _pairs(anchors, a_lab, refs, r_lab, exclude_self):
        iota = 1.0 if same else -1.0
        term = torch.clamp(iota * (dist(anchors[i], refs[k]) - beta) + alpha, min=0.0)
        (pos if same else neg).append(term)
    if reduction == "mean":
        return sum(pos + neg) / len(pos + neg)
    out = 0.0
    for terms in (pos, neg):
        nz = [t for t in terms if float(t) > 0]
        if nz:
            out = out + sum(nz) / len(nz)
    return out


def c1(anchors, a_lab, refs, r_lab, margin, eps=1e-5, exclude_self=False, reduction="anchor"):
    """XBM contrastive: Σ_pos (1 − s)[s < 1 − ε] + Σ_neg s[s > μ], divided by the number of anchors."""
    total, count = 0.0, 0
    for i, k, same in _pairs(anchors, a_lab, refs, r_lab, exclude_self):
        s = dot(anchors[i], refs[k])
        count += 1
        if same and float(s) < 1 - eps:
            total = total + (1 - s)
        if not same and float(s) > margin:
            total = total + s
    return total / len(anchors) if reduction == "anchor" else total / count


def ms(anchors, a_lab, refs, r_lab, alpha, beta, lam, exclude_self=False, mining=False, epsilon=0.1):
    """Multi-similarity (Wang 2019b), mean over anchors."""
    total = 0.0
    for i in range(len(anchors)):
        sims = {}
        for ii, k, same in _pairs(anchors, a_lab, refs, r_lab, exclude_self):
            if ii == i:
                sims[k] = (dot(anchors[i], refs[k]), same)
        pos = [s for s, same in sims.values() if same]
        neg = [s for s, same in sims.values() if not same]
        if mining:
            max_neg = max((float(s) for s in neg), default=-math.inf)
            min_pos = min((float(s) for s in pos), default=math.inf)
            pos_k = [s for s in pos if float(s) - epsilon < max_neg]
            neg_k = [s for s in neg if float(s) + epsilon > min_pos]
            pos, neg = pos_k, neg_k
        sp = sum((torch.exp(-alpha * (s - lam)) for s in pos), torch.zeros((), dtype=torch.float64))
        sn = sum((torch.exp(beta * (s - lam)) for s in neg), torch.zeros((), dtype=torch.float64))
        total = total + torch.log(1 + sp) / alpha + torch.log(1 + sn) / beta
    return total / len(anchors)


def triplet(anchors, a_lab, refs, r_lab, margin, exclude_self=False, reduction="nonzero"):
    """[d_ap − d_an + μ]_+ over all (a, p, n); mean over non-zero (or all) triplets."""
    terms = []
    for i in range(len(anchors)):
        for p in range(len(refs)):
            if (exclude_self and p == i) or int(a_lab[i]) != int(r_lab[p]):
                continue
            for n in range(len(refs)):
                if int(a_lab[i]) == int(r_lab[n]):
                    continue
                terms.append(torch.clamp(dist(anchors[i], refs[p]) - dist(anchors[i], refs[n]) + margin, min=0.0))
    if reduction == "mean":
        return sum(terms) / len(terms)
    nz = [t for t in terms if float(t) > 0]
    return sum(nz) / len(nz) if nz else 0.0 * sum(terms)
