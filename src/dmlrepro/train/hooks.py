"""After-epoch hooks of the training loop, and the checkpoint policy.

* :class:`TestEvaluation`: the test (and gallery) embeddings and their metrics at an evaluated
  epoch; ``eval.select: best_test`` bookkeeping; the selected model's embedding files.
* :func:`proxy_metrics`: W₂ (PFML Table 3), AvgDTP (RSW Table III) and the proxy-trap diagnostics.
* :class:`CheckpointPolicy`: whether an epoch's end is checkpointed (``speed.checkpoint_overhead``).

Validation (with ASAP's projections) is the hook :class:`dmlrepro.train.validation.Validation`.
All of them embed through the run's :class:`~dmlrepro.train.embedder.Embedder`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from dmlrepro.evaluation import avg_dtp, proxy_data_w2, save_embeddings
from dmlrepro.evaluation.proxy_trap import adam_step_ratio, intra_class_spread, sampler_batches, zero_gradient_share
from dmlrepro.losses import proxy_points
from dmlrepro.losses.proxies import declared_proxies

from . import checkpoint as _checkpoint
from .run_evaluation import embedding_metrics
from .state import RunDir, TrainState


class TestEvaluation:
    """Test-split evaluation after an epoch (query→gallery with ``dataset.gallery_split``)."""

    __test__ = False  # not a pytest class

    def __init__(self, cfg: dict, *, test_ds, gallery_ds, model, embedder, rundir: RunDir):
        self.cfg, self.model, self.embedder, self.rundir = cfg, model, embedder, rundir
        d = cfg["dataset"]
        self.sets = [(test_ds, d["test_split"], False)]
        if gallery_ds is not None:
            self.sets.append((gallery_ds, d["gallery_split"], True))

    def due(self, epoch: int, final: bool) -> bool:
        """Evaluated epochs: every ``eval.every``-th and the final one (with best_val the final test
        evaluation is of the restored best model, at the finish)."""
        every = self.cfg["eval"]["every"]
        return (final and self.cfg["eval"]["select"] != "best_val") or bool(every and epoch % every == 0)

    def __call__(self, epoch: int, state: TrainState, final: bool = False) -> dict[str, float] | None:
        """The metrics after `epoch` (None: embeddings not finite); saves the embeddings of a new
        best (best_test) or, with `final`, those of the final model."""
        cfg = self.cfg
        embedded = [
            self.embedder.embed(ds, desc=f"eval {split} epoch {epoch}", on_device=True) for ds, split, _ in self.sets
        ]
        (emb, labels, _), gallery = embedded[0], embedded[1][:2] if len(embedded) > 1 else None
        metrics = embedding_metrics(emb, labels, cfg, gallery)
        if metrics is None:
            return None
        if cfg["eval"]["select"] == "best_test" and epoch > 0:
            if state.best is None or metrics["recall@1"] > state.best["recall@1"]:
                state.best = {"epoch": epoch, "recall@1": metrics["recall@1"]}
                self._save(embedded, True, {"epoch": epoch, "select": "best_test"})
                _checkpoint.write_verified(
                    self.rundir.best_model("best_test"), {"epoch": epoch, "model": self.model.state_dict()}
                )
        elif final:
            self._save(embedded, False, {"epoch": epoch, "select": cfg["eval"]["select"]})
        return metrics

    def _save(self, embedded, best: bool, meta: dict) -> None:
        for (_, split, gallery), (e, y, rows) in zip(self.sets, embedded):
            path = self.rundir.best_embeddings(gallery) if best else self.rundir.embeddings(gallery)
            save_embeddings(path, e, y, rows, split=split, meta=meta)

    def files(self) -> list[tuple[Path, Path]]:
        """(best_test file, final file) pairs, the queries' last: its presence marks both moved."""
        return [(self.rundir.best_embeddings(g), self.rundir.embeddings(g)) for _, _, g in reversed(self.sets)]


def proxy_metrics(cfg: dict, embedder, train_eval_ds, labelmap, loss, optimizer=None) -> dict[str, float]:
    """W₂ (PFML Table 3), AvgDTP (RSW Table III) and the proxy-trap diagnostics (`trap`:
    dmlrepro.evaluation.proxy_trap) of the current proxies against the training split, embedded
    with the eval transform (docs/readings/pfml.md#pfml-r24, RSW-R15)."""
    proxies, proxy_labels = (t.cpu().numpy() for t in proxy_points(loss))
    if len(proxies) == 0:  # no proxies (PFML's M = 0 ablation, Fig. 3a): W₂ and AvgDTP are not defined
        return {}
    emb, labels, _ = embedder.embed(train_eval_ds, desc="embed train")
    labels = labelmap(torch.as_tensor(labels)).numpy()
    out = {}
    if "w2" in cfg["eval"]["proxy_metrics"]:
        out["w2"] = proxy_data_w2(emb, labels, proxies, proxy_labels, w_power=cfg["eval"]["w_power"])
        delta = getattr(loss, "delta_att", None)  # the δ supp. eq. (16) bounds W₂ by (PFML's, CPML's)
        if delta:
            out["proxy_delta"] = float(delta)
    if "avg_dtp" in cfg["eval"]["proxy_metrics"]:
        out["avg_dtp"] = avg_dtp(emb, labels, proxies, proxy_labels)
    if "trap" in cfg["eval"]["proxy_metrics"]:
        out.update(proxy_trap_metrics(cfg, loss, optimizer, emb, labels, proxies, proxy_labels))
    return out


def proxy_trap_metrics(cfg: dict, loss, optimizer, emb, labels, proxies, proxy_labels) -> dict[str, float]:
    """`trap`: the proxies' spread over δ (losses with a `delta`), the share of zero proxy gradients
    on 20 training batches drawn as the run's sampler draws them, and Adam's last median step over
    lr·√D (a trained Parameter under Adam); the keys that apply (dmlrepro.evaluation.proxy_trap)."""
    out = {}
    delta = getattr(loss, "delta_att", None)  # PFML's and CPML's δ (δ_att where δ_rep differs)
    spread = intra_class_spread(proxies, proxy_labels)
    if delta and spread is not None:
        out["proxy_spread"] = spread / delta
    param = declared_proxies(loss).tensor(loss)
    if isinstance(param, torch.nn.Parameter):
        d = cfg["dataset"]
        m = d["m"] if d["sampler"] == "m_per_class" else None
        batches = sampler_batches(labels, d["batch_size"], m, n_batches=20, seed=cfg["seed"])
        out["zero_grad_share"] = zero_gradient_share(loss, param, emb, labels, batches)
        ratio = None if optimizer is None else adam_step_ratio(optimizer, param)
        if ratio is not None:
            out["step_ratio"] = ratio
    return out


class CheckpointPolicy:
    """Whether the end of an epoch is checkpointed. ``overhead`` (runtime key
    ``speed.checkpoint_overhead``, default 0.02) bounds the wall time this process spends on
    checkpoints: a checkpoint is written when the seconds spent on them so far plus the last
    one's stay within ``overhead`` × the seconds since training started here. A last checkpoint
    smaller than ``floor_mb`` (``speed.checkpoint_floor_mb``) is cheap whatever it took, so the
    next is written too (small models: a size, unlike a time, does not depend on the machine's
    load). 1 (or more) writes every epoch, 0 none (the loop still writes one after the last
    epoch and on a signal)."""

    def __init__(self, overhead: float, floor_mb: float = 0.0, clock=time.perf_counter):
        self.overhead, self.floor_mb, self.clock = float(overhead), float(floor_mb), clock
        self.start = clock()
        self.spent = 0.0
        self.last: float | None = None
        self.last_mb = 0.0

    def due(self) -> bool:
        if self.overhead <= 0:
            return False
        if self.overhead >= 1 or self.last is None or self.last_mb < self.floor_mb:
            return True
        return self.spent + self.last <= self.overhead * (self.clock() - self.start)

    def record(self, seconds: float, nbytes: int) -> None:
        self.spent += seconds
        self.last, self.last_mb = seconds, nbytes / 2**20
