"""XBM, cross-batch memory (Wang et al. 2020, "Cross-Batch Memory for Embedding Learning", CVPR):
the C1-XBM / C2-XBM baselines of the ASAP paper (App. A.2 "XBM"; readings ASAP-R14, ASAP-R29
and ASAP-R39 of docs/readings/asap.md).

XBM keeps a FIFO ring buffer of the M most recent embeddings and their labels. The stored
embeddings are detached: no gradient flows into the memory, which stands in for more samples per
step (the "slow drift" assumption: embeddings of a sample change slowly, so recent past embeddings
are close to the current ones). Each training step

1. normalises the batch with the ASAP transform 𝒩 (paper §4.4, `normalize="lipschitz"`, as
   :class:`~dmlrepro.losses.asap.PairLoss`; ASAP-R31: every method uses it);
2. computes the base pair loss (C1, C2, MS or Triplet of :mod:`dmlrepro.losses.pair_bases`) with the batch
   samples as anchors:

   * ``combine="sum"`` (default; ASAP-R39, the later code's `losses/xbm.py`):
     loss = ℓ(batch, batch) + memory_weight · ℓ(batch, memory), weights 1 and 1, where
     ℓ(batch, batch) excludes self-pairs (the plain :class:`PairLoss`);
   * ``combine="union"``: loss = ℓ(batch, batch ∪ memory) with self-pairs excluded, i.e. one
     reduction over all references (what pytorch-metric-learning's ``CrossBatchMemory`` computes).

   For C1 (reduction "anchor": sum / number of anchors) the two are the same number; for C2, MS and
   Triplet the non-zero averaging / log-sum-exp make them differ.
3. enqueues the (normalised, detached) batch, overwriting the oldest entries.

The memory is used only from the ``start_step``-th training call on (0-based): "We perform 1K steps
of training with the baseline loss prior to integrate XBM loss in order to ensure slow drift"
(paper A.2: 1K on every dataset). Before that the loss is exactly the plain
:class:`PairLoss` of the same base loss.

Memory sizes (paper A.2; ASAP-R14: used verbatim), in batches of 32, ``memory_size`` = batches × 32:
CUB / Cars (S, L) = (3, 25) → 96 / 800; InShop (100, 400) → 3,200 / 12,800; SOP (400, 1400) →
12,800 / 44,800. The paper evaluates C1 and C2 with XBM (ASAP-R29: C1 is XBM's official contrastive
loss); MS and Triplet are registered too for completeness.

Readings (not fixed by the paper; switches where it matters):

* **Enqueue after the loss**: the memory seen by step t holds steps < t only, so the batch never
  meets a detached copy of itself and no memory pair is a self-pair. XBM's official code and the
  later ASAP code enqueue *before* the loss, so their memory term also pairs the batch with its own
  detached copy (C1 drops the self-pairs through its s < 1 − ε test; C2 / MS / Triplet would not).
  With ``combine="union"`` this module and pytorch-metric-learning's ``CrossBatchMemory`` of size
  M + batch (enqueue-first, self-comparisons removed) give the same value; gradients differ because
  there the batch's own references are the detached memory copies.
* **Memory filled during pre-training**: every training call enqueues, also before ``start_step``
  (as the later ASAP code, which enqueues from step 0), so the memory is full of recent embeddings
  when it switches on. XBM's official code starts enqueueing at its start iteration.
* **Partially filled memory** (fewer than M stored): only the stored entries are references.
* ``memory_size`` counts embeddings, not batches; batches may have any size ≤ memory_size (the
  ring pointer wraps inside a batch); a batch larger than the memory is rejected (ValueError).
* The stored embeddings are 𝒩-normalised (𝒩 is applied per vector, so storing raw vectors and
  normalising when reading gives the same references).
* Only calls in training mode (``self.training``) count steps and enqueue; eval-mode calls compute
  the same loss with the current memory and change nothing. A batch with non-finite embeddings is
  not enqueued (the step still counts), so one diverged step cannot poison the memory.

State: the memory (embeddings, labels), write pointer, fill count and step counter are registered
buffers, so they are saved in and restored from ``state_dict()`` (checkpoint resume reproduces the
next loss exactly). No learnable parameters.
"""

from __future__ import annotations

import torch
from torch import nn

from ..asap.normalisation import MODES, normalize
from .asap import ASAP
from .base import check_embeddings, full_precision
from .pair_bases import BASES, build_pair_base
from .registry import register_loss

COMBINE = ("sum", "union")


class XBMLoss(nn.Module):
    """A base pair loss of :mod:`dmlrepro.losses.pair_bases` with a cross-batch memory (XBM).

    `forward(embeddings, labels)` → scalar.

    Args:
        base_loss: "c1" | "c2" | "ms" | "triplet"; remaining keyword arguments go to the base loss.
        embedding_size: D, the width of the stored embeddings.
        memory_size: M, number of stored embeddings (config writes batches × 32). Default 800 = the
            CUB/Cars "L" memory (25 batches).
        start_step: number of training calls with the plain in-batch loss before the memory is used
            (XBM pre-training; 1000 in the paper).
        combine: "sum" (ℓ(b, b) + memory_weight·ℓ(b, memory), ASAP-R39) or "union" (ℓ(b, b ∪ memory)).
        memory_weight: weight of the memory term for ``combine="sum"`` (1.0: XBM's formulation, ASAP-R39).
        normalize: "lipschitz" (paper), "l2" or "none", as PairLoss.
    """

    def __init__(
        self,
        base_loss: str,
        embedding_size: int,
        memory_size: int = 800,
        start_step: int = 1000,
        combine: str = "sum",
        memory_weight: float = 1.0,
        normalize: str = "lipschitz",
        **hparams,
    ):
        super().__init__()
        if normalize not in MODES:
            raise ValueError(f"XBMLoss: normalize must be one of {MODES}, got {normalize!r}")
        if combine not in COMBINE:
            raise ValueError(f"XBMLoss: combine must be one of {COMBINE}, got {combine!r}")
        if combine == "union" and memory_weight != 1.0:
            raise ValueError("XBMLoss: memory_weight applies to combine='sum' only")
        if int(memory_size) != memory_size or memory_size < 1:
            raise ValueError(f"XBMLoss: memory_size must be a positive integer (embeddings), got {memory_size!r}")
        if int(start_step) != start_step or start_step < 0:
            raise ValueError(f"XBMLoss: start_step must be an integer >= 0, got {start_step!r}")
        if embedding_size < 1:
            raise ValueError(f"XBMLoss: embedding_size must be >= 1, got {embedding_size}")
        self.base_name, self.base = base_loss, build_pair_base(base_loss, hparams)
        self.embedding_size, self.memory_size, self.start_step = int(embedding_size), int(memory_size), int(start_step)
        self.combine, self.memory_weight, self.normalize = combine, memory_weight, normalize
        self.register_buffer("memory_embeddings", torch.zeros(self.memory_size, self.embedding_size))
        self.register_buffer("memory_labels", torch.full((self.memory_size,), -1, dtype=torch.long))
        self.register_buffer("memory_ptr", torch.zeros((), dtype=torch.long))  # next slot to write
        self.register_buffer("memory_filled", torch.zeros((), dtype=torch.long))  # stored entries, ≤ M
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))  # training calls so far

    def extra_repr(self) -> str:
        return (
            f"base={self.base_name}, memory_size={self.memory_size}, start_step={self.start_step}, "
            f"combine={self.combine}, memory_weight={self.memory_weight}, normalize={self.normalize}"
        )

    def memory(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored (embeddings, labels), slot order (not chronological), only the filled slots."""
        n = int(self.memory_filled)
        return self.memory_embeddings[:n], self.memory_labels[:n]

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_embeddings(self, embeddings, self.embedding_size)
        if len(embeddings) > self.memory_size:
            raise ValueError(
                f"XBMLoss: memory_size {self.memory_size} is smaller than the batch of "
                f"{len(embeddings)} embeddings; memory_size counts embeddings (batches × batch size)"
            )
        with full_precision(embeddings) as dtype:
            e = normalize(embeddings.to(dtype), self.normalize)
            loss = self._memory_loss(e, labels)
            if self.training:
                self._enqueue(e.detach(), labels.detach())
                self.steps += 1
        return loss

    def _memory_loss(self, e: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The plain in-batch loss before `start_step` (or with an empty memory), then `combine`'s loss."""
        mem, mem_lab = self.memory()
        if int(self.steps) < self.start_step or len(mem) == 0:
            return self.base(e, labels, e, labels, exclude_self=True)
        # a copy: the enqueue after the loss writes into the buffer in place, after autograd saved it
        mem, mem_lab = mem.to(e.dtype, copy=True), mem_lab.to(labels.device, copy=True)
        if self.combine == "sum":
            return self.base(e, labels, e, labels, exclude_self=True) + self.memory_weight * self.base(
                e, labels, mem, mem_lab
            )
        # batch first among the references: exclude_self removes the batch diagonal only
        return self.base(e, labels, torch.cat([e, mem]), torch.cat([labels, mem_lab]), exclude_self=True)

    @torch.no_grad()
    def _enqueue(self, e: torch.Tensor, labels: torch.Tensor) -> None:
        if not bool(torch.isfinite(e).all()):
            return
        b = len(e)
        idx = (self.memory_ptr + torch.arange(b, device=self.memory_ptr.device)) % self.memory_size
        self.memory_embeddings[idx] = e.to(self.memory_embeddings)
        self.memory_labels[idx] = labels.to(self.memory_labels)
        self.memory_ptr.copy_((self.memory_ptr + b) % self.memory_size)
        self.memory_filled.copy_((self.memory_filled + b).clamp(max=self.memory_size))


def _xbm(base):
    def build(num_classes: int, embedding_size: int, **hparams) -> XBMLoss:
        return XBMLoss(base, embedding_size, **hparams)

    return build


#: name -> builder(num_classes, embedding_size, **hparams), each registered (the ASAP paper's XBM baselines)
XBM_LOSSES = {f"xbm_{b}": register_loss(f"xbm_{b}", paper=ASAP, build=_xbm(b)) for b in BASES}

__all__ = ["COMBINE", "XBMLoss", "XBM_LOSSES"]
