"""ASAP's alternation schedule as a pure state machine (paper §4.4 "Solving projections", A.2; docs/readings/asap.md).

The engine trains and calls :meth:`AlternationSchedule.observe` with the validation MAP@R every
`eval_every` steps; the returned :class:`Decision` says what to do:

* ``improved_global`` — new global best: keep a copy of θ (restored at the end, "recover the
  parameters with the best validation performance").
* ``improved_projection`` — new best within this projection: with ``anchor="best"`` (ASAP-R4) copy θ and
  ρ (``ProximalRegularizer.capture()``); they become θ* and the k-Center seeds at the next alternation.
* ``alternate`` — the projection has converged (no improvement > `min_delta` for
  `projection_patience` evaluations inside it): θ* ← θ_bp (or θ, ASAP-R4), ρ ← GreedyKCenterProxy(ρ*, b,
  f(·; θ*)), λ_eff ← ``decision.lam``; reset the optimiser only if ``decision.reset_optimizer`` (ASAP-R5).
  The live θ continues from its current value.
* ``stop`` — global early stopping: no improvement for `global_patience` evaluations (ASAP-R7). It is
  checked first: an evaluation that stops never also alternates.

Every projection's first evaluation improves on its (reset) best of −∞, so with patience pp a
projection lasts at least (pp + 1)·E steps (Fig. 4(b)) and always a multiple of E.

Ambiguity switches, defaults = the project's readings (docs/readings/asap.md):

* ASAP-R3 ``lambda_first_projection=False``: λ_eff = 0 in the first projection, λ afterwards.
* ASAP-R4 ``anchor="best"``: θ* / ρ* are the best-validation values inside the projection (``"last"``: the
  values at the alternation).
* ASAP-R5 ``reset_optimizer=False``: one optimiser for the whole run.
* ASAP-R7 ``global_patience_unit="evaluations"``: 60 evaluations (``"steps"``: the literal "60 steps",
  i.e. stop once the last global improvement is ≥ `global_patience` steps old).
* ASAP-R16 :meth:`AlternationSchedule.loss_proxy`: the Loss-Proxy variant — one projection, λ = 0, no
  alternation, stopped by the global patience only (P is the caller's; the reading, ASAP-R16, is ASAP-L's P).

Logs are plain dicts: :attr:`evaluations` (per evaluation: step, map_r, λ_eff, projection id, …),
:attr:`projections` (per projection: start/end step, steps, evaluations, best MAP@R and its step),
:attr:`alternations` (per alternation: step, from/to projection; :meth:`record_alternation` adds
e.g. the k-Center wall time and the covering radius).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dmlrepro.config_names import ANCHORS  # the config check's choices, torch-free

PATIENCE_UNITS = ("evaluations", "steps")


@dataclass(frozen=True)
class Decision:
    step: int
    evaluation: int  # 1-based count of evaluations so far
    value: float  # the observed validation MAP@R
    improved_global: bool
    improved_projection: bool
    alternate: bool
    stop: bool
    lam: float  # λ_eff to use from the next step on
    projection: int  # projection id from the next step on (0-based)
    reset_optimizer: bool


class AlternationSchedule:
    """Validation-driven alternation and early stopping of ASAP (Alg. 1 with Sec. 4.4's early stopping).

    Args:
        eval_every: E, steps between validations (25 CUB/Cars, 250 SOP/InShop).
        projection_patience: pp = 3 evaluations without improvement inside a projection.
        global_patience: pg = 60 (ASAP-R7 unit: `global_patience_unit`).
        min_delta: an evaluation improves iff value > best + min_delta (1e-5, later code).
        lam: λ = 2e-4, the proximal weight once it is active.
        alternate: False gives a single projection (Loss-Proxy; see :meth:`loss_proxy`).
        lambda_first_projection, anchor, reset_optimizer, global_patience_unit: ASAP-R3, ASAP-R4, ASAP-R5, ASAP-R7.
        max_alternations: optional cap on the number of alternations (None: unbounded, the paper).
    """

    def __init__(
        self,
        eval_every: int,
        projection_patience: int = 3,
        global_patience: int = 60,
        min_delta: float = 1e-5,
        lam: float = 2e-4,
        alternate: bool = True,
        lambda_first_projection: bool = False,
        anchor: str = "best",
        reset_optimizer: bool = False,
        global_patience_unit: str = "evaluations",
        max_alternations: int | None = None,
    ):
        if eval_every < 1 or projection_patience < 1 or global_patience < 1:
            raise ValueError(
                f"AlternationSchedule: eval_every, projection_patience and global_patience must be "
                f">= 1, got {eval_every}, {projection_patience}, {global_patience}"
            )
        if anchor not in ANCHORS:
            raise ValueError(f"AlternationSchedule: anchor must be one of {ANCHORS}, got {anchor!r}")
        if global_patience_unit not in PATIENCE_UNITS:
            raise ValueError(
                f"AlternationSchedule: global_patience_unit must be one of {PATIENCE_UNITS}, "
                f"got {global_patience_unit!r}"
            )
        if lam < 0 or min_delta < 0:
            raise ValueError(f"AlternationSchedule: lam and min_delta must be >= 0, got {lam}, {min_delta}")
        self.eval_every, self.projection_patience, self.global_patience = (
            eval_every,
            projection_patience,
            global_patience,
        )
        self.min_delta, self.lam, self.alternate_enabled = min_delta, lam, alternate
        self.lambda_first_projection, self.anchor, self.reset_optimizer = (
            lambda_first_projection,
            anchor,
            reset_optimizer,
        )
        self.global_patience_unit, self.max_alternations = global_patience_unit, max_alternations
        # state
        self.best_global, self.best_global_step, self.bad_global = -math.inf, 0, 0
        self.best_projection, self.best_projection_step, self.bad_projection = -math.inf, 0, 0
        self.projection, self.projection_start, self.projection_evals = 0, 0, 0
        self.num_evaluations, self.stopped, self.last_step = 0, False, 0
        self.evaluations: list[dict] = []
        self.projections: list[dict] = []
        self.alternations: list[dict] = []

    @classmethod
    def loss_proxy(cls, eval_every: int, global_patience: int = 60, **kwargs) -> AlternationSchedule:
        """Loss-Proxy (paper §5.2, ASAP-R16): one projection to the global stop, λ = 0, no alternation."""
        return cls(eval_every, global_patience=global_patience, lam=0.0, alternate=False, **kwargs)

    @property
    def lam_eff(self) -> float:
        """λ to apply now (ASAP-R3: 0 in the first projection unless `lambda_first_projection`)."""
        if self.projection == 0 and not self.lambda_first_projection:
            return 0.0
        return self.lam

    def _improves(self, value: float, best: float) -> bool:
        return value > best + self.min_delta

    def observe(self, step: int, value: float) -> Decision:
        """Feed the validation MAP@R measured after `step` training steps; returns what to do."""
        value = self._checked(step, value)
        self.num_evaluations += 1
        self.projection_evals += 1
        self.last_step = step
        lam_before, projection_before = self.lam_eff, self.projection
        improved_global, stop = self._observe_global(step, value)  # global early stopping: checked first
        improved_projection = self._improves(value, self.best_projection)
        if improved_projection:
            self.best_projection, self.best_projection_step, self.bad_projection = value, step, 0
        else:
            self.bad_projection += 1
        capped = self.max_alternations is not None and len(self.alternations) >= self.max_alternations
        alternate = (
            not stop and self.alternate_enabled and not capped and self.bad_projection >= self.projection_patience
        )
        self.evaluations.append(
            {
                "evaluation": self.num_evaluations,
                "step": step,
                "map_r": value,
                "lambda_eff": lam_before,
                "projection": projection_before,
                "best_map_r": self.best_global,
                "best_projection_map_r": self.best_projection,
                "bad_global": self.bad_global,
                "bad_projection": self.bad_projection,
                "improved_global": improved_global,
                "improved_projection": improved_projection,
                "alternate": alternate,
                "stop": stop,
            }
        )
        if alternate or stop:
            self._close_projection(step, "alternation" if alternate else "early_stop")
        if alternate:
            self._start_next_projection(step)
        self.stopped = stop
        return Decision(
            step,
            self.num_evaluations,
            value,
            improved_global,
            improved_projection,
            alternate,
            stop,
            self.lam_eff,
            self.projection,
            alternate and self.reset_optimizer,
        )

    def _checked(self, step: int, value: float) -> float:
        """``value`` as a float, once the call is valid: the schedule runs, steps increase, no NaN."""
        if self.stopped:
            raise RuntimeError("AlternationSchedule.observe called after the schedule stopped")
        if step <= self.last_step and self.num_evaluations:
            raise ValueError(f"AlternationSchedule.observe: steps must increase ({step} after {self.last_step})")
        value = float(value)
        if math.isnan(value):
            raise ValueError(f"AlternationSchedule.observe: validation metric at step {step} is NaN")
        return value

    def _observe_global(self, step: int, value: float) -> tuple[bool, bool]:
        """(a new global best, global early stopping: ASAP-R7's patience in evaluations or in steps)."""
        improved = self._improves(value, self.best_global)
        if improved:
            self.best_global, self.best_global_step, self.bad_global = value, step, 0
        else:
            self.bad_global += 1
        if self.global_patience_unit == "evaluations":
            return improved, self.bad_global >= self.global_patience
        return improved, not improved and step - self.best_global_step >= self.global_patience

    def _start_next_projection(self, step: int) -> None:
        """Record the alternation at ``step`` (its anchor: the projection's best step under ASAP-R4's
        ``best``, else ``step``) and reset the projection's best."""
        self.alternations.append(
            {
                "alternation": len(self.alternations) + 1,
                "step": step,
                "from_projection": self.projection,
                "to_projection": self.projection + 1,
                "anchor": self.anchor,
                "anchor_step": self.best_projection_step if self.anchor == "best" else step,
            }
        )
        self.projection += 1
        self.projection_start, self.projection_evals = step, 0
        self.best_projection, self.best_projection_step, self.bad_projection = -math.inf, step, 0

    def _close_projection(self, step: int, reason: str) -> None:
        self.projections.append(
            {
                "projection": self.projection,
                "start_step": self.projection_start,
                "end_step": step,
                "steps": step - self.projection_start,
                "evaluations": self.projection_evals,
                "best_map_r": self.best_projection,
                "best_step": self.best_projection_step,
                "lambda_eff": self.lam_eff,
                "end_reason": reason,
            }
        )

    def finish(self, step: int, reason: str = "max_steps") -> None:
        """Close the open projection's record when training ends without an early stop (e.g. a step cap)."""
        if not self.stopped:
            self._close_projection(step, reason)
            self.stopped = True

    def restart(self, step: int, reason: str = "followup") -> None:
        """Go on after the global stop at `step` (the last evaluation): the plateau-triggered second
        phase of RSW App. D. The patience counter starts again; the global best stays, so an
        evaluation improves only on the best so far. The stopping evaluation's record says
        ``stop: false, restart: reason``, the closed projection record ends with `reason`, and a
        new record of the same projection opens at `step`. Evaluations patience only."""
        if not self.stopped or step != self.last_step or not self.evaluations or not self.evaluations[-1]["stop"]:
            raise RuntimeError(f"AlternationSchedule.restart: no global stop at step {step} to restart from")
        if self.global_patience_unit != "evaluations":
            raise ValueError("AlternationSchedule.restart: needs global_patience_unit 'evaluations'")
        self.stopped, self.bad_global = False, 0
        self.evaluations[-1].update(stop=False, restart=reason)
        self.projections[-1]["end_reason"] = reason
        self.projection_start, self.projection_evals = step, 0
        self.best_projection, self.best_projection_step, self.bad_projection = -math.inf, step, 0

    def record_alternation(self, **fields) -> None:
        """Attach fields (e.g. ``kcenter_seconds``, ``covering_radius``) to the latest alternation record."""
        if not self.alternations:
            raise RuntimeError("record_alternation: no alternation has happened yet")
        self.alternations[-1].update(fields)

    def state_dict(self) -> dict:
        """Everything needed to resume (plain Python values)."""
        keys = (
            "best_global",
            "best_global_step",
            "bad_global",
            "best_projection",
            "best_projection_step",
            "bad_projection",
            "projection",
            "projection_start",
            "projection_evals",
            "num_evaluations",
            "stopped",
            "last_step",
        )
        state = {k: getattr(self, k) for k in keys}
        state.update(
            evaluations=[dict(e) for e in self.evaluations],
            projections=[dict(p) for p in self.projections],
            alternations=[dict(a) for a in self.alternations],
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, [dict(x) for x in v] if isinstance(v, list) else v)
