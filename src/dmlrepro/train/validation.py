"""Validation on held-out training classes: early stopping, best-validation model, ASAP's schedule.

With ``validation.split`` (fold k of n class-disjoint folds of the training classes, MLRC /
ASAP protocol, ASAP-R7 and ASAP-R33; or RSW's 50/50 holdout) the engine trains on the other
training classes and, after every epoch, embeds the validation classes (eval transform) and
feeds ``validation.metric`` (MAP@R by default) to an :class:`dmlrepro.asap.AlternationSchedule`:

* a new global best saves the model to ``checkpoints/best_val_model.pt`` ("recover the
  parameters with the best validation performance"; ``eval.select: best_val`` evaluates it on
  the test split at the end);
* ``validation.patience`` evaluations without improvement stop the run (ASAP-R7: in evaluations);
  with ``followup.trigger: plateau`` the first time they do, the run instead goes on in phase 2
  (RSW App. D, :meth:`Validation.start_followup`) and the count starts again;
* with ``asap.enabled`` the same schedule decides the alternations (:mod:`.projections`).

For ASAP one epoch is one evaluation interval E: set ``steps_per_epoch: E`` (25 CUB/Cars, 250
SOP/In-Shop) and ``epochs`` to a cap on the number of evaluations.

Every evaluation, projection and alternation is logged in ``<run>/validation_log.json``
(ASAP Figs. 4(b) and 7 read them); ``steps`` there are optimizer steps.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from dmlrepro.asap import AlternationSchedule
from dmlrepro.atomic import write_json_atomic
from dmlrepro.evaluation import save_embeddings

from . import checkpoint as _checkpoint
from .run_evaluation import embedding_metrics
from .state import VAL_EMBEDDINGS_DIR, VALIDATION_LOG_FILE as LOG_FILE, RunDir

__all__ = ["LOG_FILE", "VAL_EMBEDDINGS_DIR", "Validation"]


class Validation:
    """The after-epoch validation hook: embeds the validation classes with the run's
    :class:`~dmlrepro.train.embedder.Embedder`, feeds the schedule and acts on its decision
    (best-validation model, ASAP's :class:`~dmlrepro.train.projections.Projections`)."""

    def __init__(self, cfg: dict, dataset, *, model, embedder, rundir: RunDir, steps_per_epoch: int, projections=None):
        self.cfg, self.ds, self.model, self.embedder, self.rundir = cfg, dataset, model, embedder, rundir
        self.projections = projections
        v, a = cfg["validation"], cfg["asap"]
        asap = a["enabled"]
        patience = v["patience"] if v["patience"] is not None else sys.maxsize
        self.schedule = AlternationSchedule(
            eval_every=max(steps_per_epoch, 1),
            projection_patience=a["projection_patience"] if asap else 1,
            global_patience=patience,
            min_delta=v["min_delta"],
            lam=a["lam"] if asap else 0.0,
            alternate=asap and a["alternate"],
            lambda_first_projection=a["lambda_first_projection"],
            anchor=a["anchor"],
            reset_optimizer=a["reset_optimizer"],
            max_alternations=a["max_alternations"],
        )
        self.metric = v["metric"]
        self.selections: list[dict[str, Any]] = []  # k-Center selections (the initial one and each alternation)

    @property
    def stopped(self) -> bool:
        return self.schedule.stopped

    def evaluate(self, epoch: int, step: int) -> dict[str, float] | None:
        """Validation metrics after `epoch` (global optimizer step `step`; None if the embeddings
        are not finite), and the schedule's decision acted upon."""
        cfg = self.cfg
        emb, labels, rows = self.embedder.embed(self.ds, desc=f"validate epoch {epoch}")
        metrics = embedding_metrics(emb, labels, {**cfg, "eval": {**cfg["eval"], "nmi": False}})
        if metrics is None:
            return None
        decision = self.schedule.observe(step, metrics[self.metric])
        if decision.improved_global and cfg["eval"]["select"] == "best_val":
            _checkpoint.write_verified(
                self.rundir.best_model("best_val"), {"epoch": epoch, "model": self.model.state_dict()}
            )
        if self.projections is not None:
            val = {"embeddings": emb, "labels": labels, "rows": rows}
            fields = self.projections.on_evaluation(decision, val)
            if fields is not None:
                self.schedule.record_alternation(epoch=epoch, **fields)
                self._projection_ended(decision.projection - 1, val)
            if decision.stop:
                self._projection_ended(decision.projection, val)
        return metrics

    def _projection_ended(self, projection: int, current: dict[str, np.ndarray] | None) -> None:
        """With asap.save_val_embeddings: the validation embeddings at the solution θ* of the projection
        that just ended (an alternation, the early stop or the epoch cap), ASAP Fig. 7; `current` (this
        evaluation's) stands in when the projection recorded no best."""
        val = self.projections.best_val or current if self.projections is not None else None
        if val is None or not self.cfg["asap"]["save_val_embeddings"]:
            return
        folder = self.rundir.val_embeddings
        folder.mkdir(exist_ok=True)
        save_embeddings(
            self.rundir.projection_embeddings(projection),
            val["embeddings"],
            val["labels"],
            val["rows"],
            split="validation",
            meta={"projection": projection},
        )

    def record_selection(self, fields: dict[str, Any]) -> None:
        self.selections.append(fields)

    def start_followup(self, step: int) -> None:
        """Patience ran out in phase 1 of a ``followup.trigger: plateau`` run: no stop; the patience
        count starts again from this evaluation, the best so far is kept (the log's evaluation
        record says ``restart: "followup"``, its projection record ends with ``"followup"``)."""
        self.schedule.restart(step, "followup")

    def finish(self, step: int, reason: str = "max_epochs") -> None:
        """Close the open projection when the epoch cap (or the phase-2 cap, ``followup_epochs``)
        ends the run before early stopping (and save its validation embeddings, as an early stop does)."""
        self.schedule.finish(step, reason)
        self._projection_ended(self.schedule.projection, None)
        self.write_log()

    def summary(self) -> dict[str, Any]:
        s = self.schedule
        return {
            "metric": self.metric,
            "best": s.best_global,
            "best_step": s.best_global_step,
            "evaluations": s.num_evaluations,
            "early_stopped": bool(s.evaluations and s.evaluations[-1]["stop"]),
            "alternations": len(s.alternations),
        }

    def write_log(self) -> None:
        s = self.schedule
        write_json_atomic(
            self.rundir.validation_log,
            _finite_or_null(
                {
                    "metric": self.metric,
                    "steps_per_evaluation": s.eval_every,
                    "initial_selection": self.selections,
                    "evaluations": s.evaluations,
                    "projections": s.projections,
                    "alternations": s.alternations,
                }
            ),
        )

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": self.schedule.state_dict(), "selections": [dict(x) for x in self.selections]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state["schedule"])
        self.selections = [dict(x) for x in state["selections"]]


def _finite_or_null(value: Any) -> Any:
    """JSON has no ±inf (a reset projection best is −inf): those become null."""
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
