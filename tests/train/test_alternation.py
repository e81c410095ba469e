"""The loop's validation callback (dmlrepro.train.alternation) on a scripted validation: its calls at
the loop's fixed points, and the stop / phase-2 decisions of RSW App. D ("a normal phase trained until
validation accuracy plateaus, then a followup phase ..., again until validation plateaus";
docs/training.md, followup.trigger). Fast: no model, no data."""

from __future__ import annotations

from types import SimpleNamespace

from dmlrepro.train.alternation import AlternationCallback
from dmlrepro.train.state import TrainState


class ScriptedValidation:
    """Validation whose schedule's `stopped` after each evaluation is given; records the calls."""

    def __init__(self, stops: list[bool], finite: bool = True):
        self.stops, self.finite, self.calls = list(stops), finite, []
        self.stopped = False

    def evaluate(self, epoch, step):
        self.calls.append(("evaluate", epoch, step))
        if not self.finite:
            return None
        self.stopped = self.stops.pop(0)
        return {"map@r": 0.5}

    def start_followup(self, step):
        self.calls.append(("start_followup", step))
        self.stopped = False

    def finish(self, step, reason):
        self.calls.append(("finish", step, reason))

    def record_selection(self, fields):
        self.calls.append(("record_selection", fields))

    def write_log(self):
        self.calls.append(("write_log",))


def settings(trigger="plateau", followup_epochs=0, epochs=10):
    return SimpleNamespace(followup_trigger=trigger, followup_epochs=followup_epochs, epochs=epochs)


def run(callback, state, epochs):
    """The loop's calls: after each epoch until a stop; the position moves on as the loop's does."""
    for epoch in range(1, epochs + 1):
        state.global_step = 3 * epoch
        callback.after_epoch(epoch, state)
        if state.stopped:
            return epoch
    return None


def test_patience_out_in_phase_1_switches_to_phase_2_and_the_second_time_stops():
    val, state = ScriptedValidation([False, True, False, False, True]), TrainState()
    stopped = run(AlternationCallback(val, None, settings()), state, 10)
    assert state.followup_start == 3  # patience ran out after epoch 2: phase 2 from epoch 3
    assert ("start_followup", 6) in val.calls  # the patience count restarts at epoch 2's step
    assert stopped == state.stopped == 5  # out again after epoch 5: the run stops


def test_followup_epochs_caps_phase_2():
    val, state = ScriptedValidation([True] + [False] * 9), TrainState()
    stopped = run(AlternationCallback(val, None, settings(followup_epochs=2)), state, 10)
    assert state.followup_start == 2 and stopped == 3  # phase-2 epochs 2 and 3, then the cap


def test_without_plateau_trigger_patience_out_stops_the_run():
    val, state = ScriptedValidation([False, True]), TrainState()
    stopped = run(AlternationCallback(val, None, settings(trigger="epochs")), state, 10)
    assert stopped == 2 and state.followup_start is None
    assert not any(call[0] == "start_followup" for call in val.calls)


def test_patience_out_at_the_epochs_cap_stops_without_phase_2():
    val, state = ScriptedValidation([False, True]), TrainState()
    assert run(AlternationCallback(val, None, settings(epochs=2)), state, 2) == 2 and state.followup_start is None


def test_non_finite_validation_returns_none_and_decides_nothing():
    val, state = ScriptedValidation([], finite=False), TrainState()
    assert AlternationCallback(val, None, settings()).after_epoch(1, state) is None
    assert state.stopped is None and state.followup_start is None


def test_start_records_asap_first_selection_and_end_closes_the_open_projection():
    val, state = ScriptedValidation([]), TrainState(global_step=12)
    projections = SimpleNamespace(initialize=lambda: {"selection": 0})
    callback = AlternationCallback(val, projections, settings())
    callback.on_train_start()
    callback.on_train_end(state)  # the epochs cap ended the run
    state.stopped = 4
    callback.on_train_end(state)  # the phase-2 cap ended it
    val.stopped = True
    callback.on_train_end(state)  # early stopping closed the projection itself
    assert val.calls == [
        ("record_selection", {"selection": 0}),
        ("finish", 12, "max_epochs"),
        ("finish", 12, "followup_epochs"),
    ]
    AlternationCallback(val, None, settings()).on_train_start()  # no ASAP: no selection
    assert len(val.calls) == 3
