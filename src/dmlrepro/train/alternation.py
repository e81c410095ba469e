"""The training loop's one validation callback: what the validation schedule decides, called by
the loop at fixed points.

* :meth:`AlternationCallback.on_train_start`, before the first epoch: ASAP's first proxies (Alg. 1,
  k-Center from random samples), logged as the initial selection;
* :meth:`AlternationCallback.after_epoch`, after an epoch's steps: validation
  (:class:`~dmlrepro.train.validation.Validation`), which saves a new best-validation model and
  makes ASAP's alternations (:class:`~dmlrepro.train.projections.Projections`: θ* ← θ_bp, new
  proxies, λ_eff); then early stopping, or RSW's switch to phase 2 (``followup.trigger: plateau``);
* :meth:`AlternationCallback.on_train_end`, when the epoch cap ended a completed run: the open
  projection's record is closed;
* :meth:`AlternationCallback.write_log`: ``validation_log.json``, with the train log.

Inside each step ASAP adds the proximal term λ_eff(θ − θ*) (and, sample-based, embeds the selected
samples): that is the :class:`~dmlrepro.train.stepper.Stepper`'s, through the same Projections.
"""

from __future__ import annotations

from .outputs import say as _say
from .projections import Projections
from .settings import RunSettings
from .state import TrainState
from .validation import Validation


class AlternationCallback:
    """The validation hook of a run with a ``validation.split``, and ASAP's projections when enabled."""

    def __init__(self, validation: Validation, projections: Projections | None, settings: RunSettings):
        self.validation, self.projections, self.settings = validation, projections, settings

    def on_train_start(self) -> None:
        if self.projections is not None:
            self.validation.record_selection(self.projections.initialize())

    def after_epoch(self, epoch: int, state: TrainState) -> dict[str, float] | None:
        """`epoch`'s validation metrics (None: the embeddings are not finite), the schedule's
        decision acted upon, and the stop or phase switch it implies."""
        metrics = self.validation.evaluate(epoch, state.global_step)
        if metrics is not None:
            self._plateau_control(epoch, state)
        return metrics

    def _plateau_control(self, epoch: int, state: TrainState) -> None:
        """After `epoch`'s validation: early stopping, and with ``followup.trigger: plateau`` (RSW
        App. D) the switch to phase 2. The first time patience runs out (before the epochs cap) the
        run does not stop: phase 2 starts at the next epoch from the current weights and optimizer
        state, the patience count starts again, and the next time it runs out the run stops;
        ``followup.epochs`` > 0 caps phase 2. ``state.followup_start`` (checkpointed with the
        position) is the first phase-2 epoch, None before the switch."""
        s = self.settings
        plateau, start = s.followup_trigger == "plateau", state.followup_start
        if self.validation.stopped:
            if plateau and start is None and epoch < s.epochs:
                self.validation.start_followup(state.global_step)
                state.followup_start = epoch + 1
                _say(f"validation plateaued after epoch {epoch}: followup phase from epoch {epoch + 1}")
            else:
                state.stopped = epoch
        elif plateau and start is not None and s.followup_epochs and epoch - start + 1 >= s.followup_epochs:
            if epoch < s.epochs:
                state.stopped = epoch  # followup.epochs phase-2 epochs done (the schedule is closed at the finish)

    def on_train_end(self, state: TrainState) -> None:
        """A completed run: the epoch cap (or the phase-2 cap of a plateau-triggered followup) ended it
        unless validation stopped it; then the open projection's record is closed."""
        if not self.validation.stopped:
            self.validation.finish(state.global_step, "followup_epochs" if state.stopped else "max_epochs")

    def write_log(self) -> None:
        self.validation.write_log()
