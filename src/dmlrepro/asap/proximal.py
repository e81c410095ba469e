"""The proximal (projection) regulariser of ASAP: λ/2 ‖θ − θ*‖² (paper eqs. 4.10–4.11, Alg. 1; ASAP-R37).

θ are the *network* weights only — Alg. 1's g_ρ has no λ term, and the later code builds its
regulariser from the model's weights before the proxies exist. θ* is the solution of the previous
projection problem, snapshotted when a new projection starts. Its gradient is λ(θ − θ*) (the sign in
the paper's printed g_θ is garbled, ASAP-R25); it is separate from ordinary weight decay.

Two equivalent uses:

* ``loss = task_loss + reg.penalty()`` — autograd adds λ(θ − θ*) to every θ's gradient;
* ``task_loss.backward(); reg.add_to_grad()`` — the later code's gradient transformer
  (``g + λ(v − prev)``), no extra graph.

``lam`` is a plain attribute, so the schedule can set λ_eff (0 in the first projection, ASAP-R3).
ASAP-R4 (θ* = best-in-projection weights vs the last ones) is the caller's choice of what to pass to
:meth:`snapshot`: :meth:`capture` copies the weights at a new best, ``snapshot(captured)`` commits it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn


class ProximalRegularizer:
    """λ/2 Σ_θ ‖θ − θ*‖² over `params` (trainable network weights), θ* snapshotted on demand.

    Args:
        params: the network's parameters (an iterable of tensors, or an ``nn.Module``); parameters
            with ``requires_grad=False`` (e.g. frozen BN) are left out.
        lam: λ (2e-4 in the paper); may be changed later (``reg.lam = ...``).
        exclude: parameters never to regularise (pass the loss's proxies to guard against mixing
            them into `params`); it is an error if one of them is in `params`.
    """

    def __init__(
        self, params: Iterable[torch.Tensor] | nn.Module, lam: float = 2e-4, exclude: Iterable[torch.Tensor] = ()
    ):
        if isinstance(params, nn.Module):
            params = params.parameters()
        excluded = {id(p) for p in exclude}
        self.params = [p for p in params if p.requires_grad]
        clash = [i for i, p in enumerate(self.params) if id(p) in excluded]
        if clash:
            raise ValueError(
                f"ProximalRegularizer: parameters {clash} are excluded (proxies?) but were passed "
                "as network weights; the proximal term acts on θ only (ASAP-R37)"
            )
        if lam < 0:
            raise ValueError(f"ProximalRegularizer: lam must be >= 0, got {lam}")
        self.lam = float(lam)
        self.anchor: list[torch.Tensor] = []
        self.snapshot()

    def capture(self) -> list[torch.Tensor]:
        """A detached copy of the current weights (for a best-in-projection θ, ASAP-R4)."""
        return [p.detach().clone() for p in self.params]

    def snapshot(self, source: Sequence[torch.Tensor] | None = None) -> None:
        """θ* ← `source` (a :meth:`capture` result) or, by default, the current weights."""
        if source is None:
            self.anchor = self.capture()
            return
        if len(source) != len(self.params) or any(s.shape != p.shape for s, p in zip(source, self.params)):
            raise ValueError("ProximalRegularizer.snapshot: source does not match the regularised parameters")
        self.anchor = [s.detach().clone().to(p) for s, p in zip(source, self.params)]

    def penalty(self) -> torch.Tensor:
        """λ/2 Σ ‖θ − θ*‖² as a differentiable scalar (0 when λ = 0)."""
        if not self.params:
            return torch.zeros(())
        total = sum(((p - a) ** 2).sum() for p, a in zip(self.params, self.anchor))
        return 0.5 * self.lam * total

    @torch.no_grad()
    def add_to_grad(self) -> None:
        """p.grad += λ(θ − θ*) for every regularised parameter that is trainable now (creates .grad
        where missing; a parameter frozen after construction, e.g. BN affine in a warm-up, is skipped)."""
        if self.lam == 0:
            return
        live = [(p, a) for p, a in zip(self.params, self.anchor) if p.requires_grad]
        if not live:
            return
        steps = torch._foreach_sub([p for p, _ in live], [a for _, a in live])  # fused: one kernel per op
        torch._foreach_mul_(steps, self.lam)
        has = [(p.grad, s) for (p, _), s in zip(live, steps) if p.grad is not None]
        for (p, _), s in zip(live, steps):
            if p.grad is None:
                p.grad = s
        if has:
            torch._foreach_add_([g for g, _ in has], [s for _, s in has])

    @torch.no_grad()
    def distance(self) -> float:
        """‖θ − θ*‖₂ (a diagnostic for the logs)."""
        return float(sum(((p - a) ** 2).sum() for p, a in zip(self.params, self.anchor)) ** 0.5) if self.params else 0.0

    def state_dict(self) -> dict:
        return {"lam": self.lam, "anchor": [a.clone() for a in self.anchor]}

    def load_state_dict(self, state: dict) -> None:
        self.lam = float(state["lam"])
        self.snapshot(state["anchor"])
