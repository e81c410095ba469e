"""One optimizer step of a run, and the device-side window between two host syncs.

:meth:`Stepper.step`: autocast forward, float32 loss, backward through the GradScaler (float16),
ASAP's proximal term, ``grad_clip`` value clipping after unscaling, the optimizer step. It never
waits for the device: a non-finite loss or gradient is flagged in the window (the first one's kind
and batch) and :meth:`Stepper.sync` reads the window once every ``speed.sync_every`` steps, adding
the loss sum to the run's position or returning the divergence record.
"""

from __future__ import annotations

from typing import Any

import torch

from .optim import base_group
from .state import TrainState


def all_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A device bool: no inf/NaN in any of `tensors`, in two fused kernels (x·0 is NaN exactly
    where x is not finite; the norm of each product is 0 or NaN), without a host sync."""
    return torch.isfinite(torch.stack(torch._foreach_norm(torch._foreach_mul(tensors, 0.0))).sum())


class Stepper:
    """The step's parts (model, loss, optimizer, label map, ASAP's projections or None), its
    autocast dtype and GradScaler, the clipped parameters and the open window."""

    def __init__(
        self,
        cfg: dict,
        *,
        model,
        loss,
        optimizer,
        groups: dict[str, list],
        labelmap,
        projections,
        device: torch.device,
        amp_dtype: torch.dtype | None,
    ):
        self.cfg, self.model, self.loss, self.optimizer = cfg, model, loss, optimizer
        self.labelmap, self.projections, self.device = labelmap, projections, device
        self.clip_params = [
            p for g, params in groups.items() if base_group(g) in cfg["grad_clip"]["groups"] for p in params
        ]
        self.set_amp(amp_dtype)

    def set_amp(self, amp_dtype: torch.dtype | None) -> None:
        """Autocast in `amp_dtype` (None: float32), with a fresh GradScaler (enabled for float16 only)."""
        self.amp_dtype = amp_dtype
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=amp_dtype == torch.float16)

    def open_window(self, state: TrainState) -> None:
        """Device-side state between two host syncs: the epoch's loss sum (float64, added in the
        order a host float would be) and the first non-finite step's kind (1 loss, 2 gradients) and batch."""
        self._loss_sum = torch.tensor(state.epoch_loss_sum, dtype=torch.float64, device=self.device)
        self._bad = torch.zeros(2, dtype=torch.int64, device=self.device)

    def sync(self, state: TrainState, epoch: int, lrs: dict[str, float]) -> dict[str, Any] | None:
        """One host read of the window: the loss sum into the position, or the divergence record of
        the first non-finite step (the position set back to just before it; later steps are void)."""
        loss_sum, kind, batch = torch.cat([self._loss_sum.view(1), self._bad.double()]).tolist()
        if not kind:
            state.epoch_loss_sum = loss_sum
            return None
        state.void_steps(state.batch - int(batch))  # the bad step and those after it in the window
        return {
            "epoch": epoch,
            "step": state.batch + 1,
            "global_step": state.global_step + 1,
            "what": "loss" if kind == 1 else "gradients",
            "lrs": lrs,
        }

    def _flag(self, bad: torch.Tensor, kind: int, batch: int) -> None:
        """Record (kind, batch) on the device if `bad` and no earlier step of the window was."""
        first, at = self._bad.unbind()
        new = bad & (first == 0)
        self._bad = torch.stack([torch.where(new, kind, first), torch.where(new, batch, at)])

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The batch's loss (autocast forward, float32 loss); sample-based ASAP (eq. 4.10) embeds
        the selected samples in the batch's forward pass and hands them to the loss as proxies."""
        dev = self.device
        anchors = (
            self.projections.anchor_images() if self.projections is not None and self.projections.samples else None
        )
        with torch.autocast(dev.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
            if anchors is None:
                emb = self.model(x)
            else:
                emb, z = self.model(torch.cat([x, anchors.to(x.dtype)])).split([len(x), len(anchors)])
        with torch.autocast(dev.type, enabled=False):  # the loss always runs in float32
            loss = self.loss(emb.float(), y) if anchors is None else self.loss(emb.float(), y, proxies=z.float())
        if anchors is not None:
            self.projections.record_anchors(z)
        return loss

    def step(self, x: torch.Tensor, y: torch.Tensor, batch: int) -> None:
        """One optimizer step on batch number `batch` of the epoch, without waiting for the device:
        a non-finite loss or gradient is flagged in the window and found by the next :meth:`sync`."""
        dev = self.device
        x = x.to(dev, non_blocking=True)
        if self.cfg["speed"]["channels_last"]:
            x = x.contiguous(memory_format=torch.channels_last)
        y = self.labelmap(y.to(dev, non_blocking=True))
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_loss(x, y)
        value = loss.detach()
        self._flag(~torch.isfinite(value), 1, batch)
        self.scaler.scale(loss).backward()
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)  # inf/NaN gradients: the scaler skips the step
        if self.projections is not None:  # ASAP's proximal term λ_eff(θ − θ*), after unscaling
            self.projections.after_backward()
        if not self.scaler.is_enabled() and self.cfg["divergence"]["check_grads"]:
            grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            if grads:
                self._flag(~all_finite(grads), 2, batch)
        clip = self.cfg["grad_clip"]["value"]
        if clip is not None:
            torch.nn.utils.clip_grad_value_([p for p in self.clip_params if p.grad is not None], clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self._loss_sum += value.double()
