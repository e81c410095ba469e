"""ASAP's alternating projections inside the training engine (paper Alg. 1, Alg. 2; docs/readings/asap.md).

:class:`Projections` holds what ASAP adds to an ordinary proxy-loss run:

* the first proxies: GreedyKCenterProxy(ρ*, b, f(·; θ)) from P random samples per class (ASAP-R1);
* the proximal term λ_eff(θ − θ*) added to the network's gradients after every backward pass
  (:class:`dmlrepro.asap.ProximalRegularizer`; 0 in the first projection, ASAP-R3);
* at every alternation decided by the validation schedule (:mod:`.validation`): θ* ← θ_bp (the
  best-in-projection weights, ASAP-R4), ρ ← GreedyKCenterProxy(ρ_bp, b, f(·; θ*)), λ_eff ← λ, and the
  optimiser's moments reset only with ``asap.reset_optimizer`` (ASAP-R5). The live θ continues.

k-Center pools are embedded with BN in inference mode, with the train augmentation
(``asap.pool_augment``, ASAP-R6), each pool image under its own seed drawn from (run seed,
alternation): pools and picks are a pure function of the run, so a resumed run picks the same
proxies. Everything is in :meth:`state_dict` (checkpoints).

Sample-based ASAP (``asap.proxies: samples``; eq. 4.10, paper §5.2, docs/asap.md): the same
k-Center selections, proximal term and schedule, but the selected samples themselves stand in for
the proxies. The loss's proxies are a buffer (no trainable proxy parameter); at every step the
engine embeds the selected images (eval transform, :meth:`Projections.anchor_images`) in the same
train-mode forward pass as the batch and hands those embeddings to the loss (gradients flow through
them into θ). At an alternation the k-Center seeds are the selected samples re-embedded under θ*
with the pool's embedder (the samples' counterpart of ρ_bp). The picks (training-set positions and
manifest rows) are logged per selection in ``validation_log.json``.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import numpy as np
import torch

from dmlrepro.asap import ProximalRegularizer, initial_proxies, select_proxies

#: salt of the k-Center seeds (pool draws and pool augmentation), beside the data stream's
_SALT = 0xA5A9


def _seed(seed: int, alternation: int, *extra: int) -> int:
    entropy = [int(seed), _SALT, int(alternation), *map(int, extra)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 2)


class Projections:
    """ASAP state of one run: proximal regulariser, best-in-projection snapshot, k-Center picks."""

    def __init__(self, cfg: dict, *, model, loss, optimizer, embedder, train_ds, train_eval_ds, labelmap):
        """`cfg` the run config; `embedder` the run's :class:`~dmlrepro.train.embedder.Embedder`;
        `train_eval_ds` a callable returning the training images with the eval transform."""
        self.cfg, self.seed = cfg["asap"], cfg["seed"]
        self.model, self.loss, self.optimizer, self.embedder = model, loss, optimizer, embedder
        self.train_ds, self.train_eval_ds, self.labelmap = train_ds, train_eval_ds, labelmap
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.reg = ProximalRegularizer(
            [p for p in model.parameters() if p.requires_grad], lam=0.0, exclude=loss.parameters()
        )
        self.best_model: dict[str, torch.Tensor] | None = None  # θ_bp (ASAP-R4 "best")
        self.best_proxies: torch.Tensor | None = None  # ρ_bp
        self.best_val: dict[str, np.ndarray] | None = None  # validation embeddings at θ_bp (Fig. 7)
        self.selections = 0  # k-Center selections so far (0 = the initial one still to do)
        # sample-based ASAP (eq. 4.10): the selected samples' training-set positions (C, P), row c·P + k
        self.samples = self.cfg["proxies"] == "samples"
        self.indices: torch.Tensor | None = None
        self._anchor_x: torch.Tensor | None = None  # their images (eval transform), on the device

    # -- embedding pools with some weights -----------------------------------------------------------
    @contextlib.contextmanager
    def _weights(self, state: dict[str, torch.Tensor] | None):
        model = self.model
        if state is None:
            yield
            return
        live = copy.deepcopy(model.state_dict())
        model.load_state_dict(state)
        try:
            yield
        finally:
            model.load_state_dict(live)

    def _embedder(self, selection: int, *salt: int):
        """embed(indices): the pool through the run's loader, BN in inference mode (ASAP-R6), pool
        image k under the seed (run seed, selection, salt) + k."""
        ds = self.train_ds if self.cfg["pool_augment"] else self.train_eval_ds()
        base = _seed(self.seed, selection, *salt)

        def embed(indices: torch.Tensor) -> torch.Tensor:
            return self.embedder.embed_seeded(ds, indices, base, desc=f"k-Center pool {selection}")

        return embed

    def _labels(self) -> torch.Tensor:
        return self.labelmap(torch.as_tensor(self.train_ds.labels, dtype=torch.long)).cpu()

    def _generator(self, selection: int) -> torch.Generator:
        g = torch.Generator()
        g.manual_seed(_seed(self.seed, selection) ^ 0x5A)
        return g

    # -- hooks called by the engine ------------------------------------------------------------------
    def initialize(self) -> dict[str, Any]:
        """The first proxies (Alg. 1's first outer iteration); θ* = θ."""
        loss, c = self.loss, self.cfg
        sel = initial_proxies(
            self._embedder(0),
            self._labels(),
            loss.num_classes,
            loss.proxies_per_class,
            c["b"],
            self._generator(0),
            first_init=c["first_init"],
            small_budget=c["small_budget"],
            normalize=c["normalize"],
        )
        loss.set_proxies(sel.proxies)
        self.reg.snapshot()
        self.selections = 1
        fields = {"selection": 0, "kcenter_seconds": sel.seconds}
        if self.samples:
            fields.update(self._picked(sel.indices))
        return fields

    # -- sample-based ASAP (eq. 4.10) -------------------------------------------------------------------
    def _picked(self, indices: torch.Tensor) -> dict[str, Any]:
        """Keep the selected samples and return their log fields (positions in the training set and
        manifest rows, one list per class, column k = proxy k)."""
        self.indices = indices.detach().cpu().long().clone()
        self._anchor_x = None
        rows = np.asarray(self.train_ds.rows)[self.indices.numpy()]
        return {"samples": self.indices.tolist(), "sample_rows": rows.tolist()}

    def anchor_images(self) -> torch.Tensor:
        """(C·P, ...) images of the selected samples with the eval transform (deterministic: no
        augmentation), row c·P + k = proxy k of class c, on the device; loaded once per selection."""
        if self._anchor_x is None:
            ds = self.train_eval_ds()
            self._anchor_x = torch.stack([ds[int(i)][0] for i in self.indices.flatten().tolist()]).to(
                self.embedder.device
            )
        return self._anchor_x

    def record_anchors(self, z: torch.Tensor) -> None:
        """Store this step's anchor embeddings (detached) as the loss's proxy values (a record for
        checkpoints, proxy metrics and the report; the loss never trains them)."""
        self.loss.set_proxies(z.detach())

    def _sample_seeds(self, embed) -> torch.Tensor:
        """The k-Center seeds of sample-based ASAP: the selected samples embedded like the pool."""
        loss = self.loss
        return embed(self.indices.flatten()).view(loss.num_classes, loss.proxies_per_class, -1)

    def after_backward(self) -> None:
        """g_θ += λ_eff (θ − θ*) on the network's trainable weights (the proxies have no λ term)."""
        self.reg.add_to_grad()

    def on_evaluation(self, decision, val_embeddings: dict[str, np.ndarray] | None) -> dict[str, Any] | None:
        """Act on the schedule's decision after a validation; returns the alternation's log fields."""
        if decision.improved_projection and self.cfg["anchor"] == "best":
            self.best_model = copy.deepcopy(self.model.state_dict())
            self.best_proxies = self.loss.proxies.detach().clone()
            if self.cfg["save_val_embeddings"]:
                self.best_val = val_embeddings
        if decision.stop or not decision.alternate:
            self.reg.lam = decision.lam
            return None
        start = time.perf_counter()
        anchor_model = self.best_model if self.cfg["anchor"] == "best" else None
        anchor_proxies = self.best_proxies if self.cfg["anchor"] == "best" else self.loss.proxies.detach().clone()
        state = anchor_model if anchor_model is not None else self.model.state_dict()
        self.reg.snapshot([state[n] for n in self.names])  # θ* ← θ_bp
        c = self.cfg
        with self._weights(anchor_model):
            if self.samples:  # the selected samples at θ*, embedded as the pool is (same space)
                anchor_proxies = self._sample_seeds(self._embedder(self.selections, 1))
            sel = select_proxies(
                self._embedder(self.selections),
                self._labels(),
                anchor_proxies.view(self.loss.num_classes, self.loss.proxies_per_class, -1),
                c["b"],
                self._generator(self.selections),
                small_budget=c["small_budget"],
                normalize=c["normalize"],
            )
        self.loss.set_proxies(sel.proxies)
        self.selections += 1
        self.reg.lam = decision.lam
        if decision.reset_optimizer:
            self.optimizer.state.clear()
        fields = {
            "kcenter_seconds": time.perf_counter() - start,
            "pool_size": int(sel.pool.shape[1]),
            "theta_distance": self.reg.distance(),
        }
        if self.samples:
            fields.update(self._picked(sel.indices))
        return fields

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {
            "reg": self.reg.state_dict(),
            "best_model": self.best_model,
            "best_proxies": self.best_proxies,
            "best_val": None if self.best_val is None else {k: torch.as_tensor(v) for k, v in self.best_val.items()},
            "selections": self.selections,
        }
        if self.samples:
            state["indices"] = None if self.indices is None else self.indices.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reg.load_state_dict(state["reg"])
        self.best_model, self.best_proxies, self.selections = (
            state["best_model"],
            state["best_proxies"],
            state["selections"],
        )
        self.best_val = None if state["best_val"] is None else {k: v.numpy() for k, v in state["best_val"].items()}
        if self.samples:
            self.indices, self._anchor_x = state.get("indices"), None
