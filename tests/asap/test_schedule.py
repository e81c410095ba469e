"""The alternation schedule: projection patience, global early stopping, λ_eff, Loss-Proxy, logs."""

import pytest

from dmlrepro.asap import AlternationSchedule


def _run(schedule, values, E):
    decisions = []
    for i, v in enumerate(values, start=1):
        decisions.append(schedule.observe(i * E, v))
        if decisions[-1].stop:
            break
    return decisions


@pytest.mark.parametrize("pp", [1, 3, 5])
def test_alternation_exactly_after_patience(pp):
    E = 25
    s = AlternationSchedule(E, projection_patience=pp, global_patience=100)
    values = [0.10, 0.20] + [0.20] * pp + [0.3]  # an improvement, then pp non-improving evaluations
    d = _run(s, values, E)
    flags = [x.alternate for x in d]
    assert flags == [False, False] + [False] * (pp - 1) + [True, False]  # not one evaluation earlier
    alt = d[1 + pp]
    assert alt.step == (2 + pp) * E and alt.projection == 1
    assert s.alternations[0]["step"] == alt.step and s.alternations[0]["anchor_step"] == 2 * E
    # the new projection's best is reset: its first evaluation improves even below the global best
    s2 = AlternationSchedule(E, projection_patience=pp, global_patience=100)
    d2 = _run(s2, [0.5] + [0.4] * pp + [0.1], E)
    assert d2[pp].alternate and d2[-1].improved_projection and not d2[-1].improved_global


def test_min_delta_counts_tiny_gains_as_no_improvement():
    s = AlternationSchedule(10, projection_patience=3, global_patience=100, min_delta=1e-5)
    d = _run(s, [0.5, 0.500005, 0.500008, 0.500009], 10)  # all within min_delta of the best 0.5
    assert [x.improved_projection for x in d] == [True, False, False, False]
    assert d[-1].alternate


def test_global_early_stopping():
    E, pg = 25, 6
    s = AlternationSchedule(E, projection_patience=3, global_patience=pg)
    d = _run(s, [0.3] + [0.2] * 20, E)
    assert len(d) == 1 + pg and d[-1].stop and not any(x.stop for x in d[:-1])
    assert d[-1].step == (1 + pg) * E
    # stop is checked first: an evaluation that stops never also alternates
    assert not d[-1].alternate
    assert [x.alternate for x in d].count(True) == 1  # evaluation 4 (3 bad) alternated once
    assert s.projections[-1]["end_reason"] == "early_stop"
    with pytest.raises(RuntimeError):
        s.observe(100 * E, 0.9)


def test_global_patience_survives_alternations():
    """The global counter is not reset by an alternation; a global improvement resets it."""
    s = AlternationSchedule(1, projection_patience=2, global_patience=5)
    d = _run(s, [0.5, 0.4, 0.4, 0.45, 0.45, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1], 1)
    assert [x.alternate for x in d][:6] == [False, False, True, False, False, False]
    assert d[5].improved_global and d[-1].stop and d[-1].step == 11


def test_lambda_eff_and_optimizer_reset():
    s = AlternationSchedule(5, projection_patience=1, global_patience=50, lam=2e-4)
    assert s.lam_eff == 0.0  # ASAP-R3: λ off in the first projection
    d = _run(s, [0.1, 0.1], 5)
    assert d[0].lam == 0.0 and d[1].alternate and d[1].lam == 2e-4 and not d[1].reset_optimizer
    assert s.evaluations[1]["lambda_eff"] == 0.0 and s.lam_eff == 2e-4
    on = AlternationSchedule(5, projection_patience=1, lambda_first_projection=True, reset_optimizer=True)
    assert on.lam_eff == 2e-4
    assert _run(on, [0.1, 0.1], 5)[1].reset_optimizer


def test_loss_proxy_single_projection():
    s = AlternationSchedule.loss_proxy(25, global_patience=4)
    d = _run(s, [0.1, 0.2] + [0.1] * 10, 25)
    assert not any(x.alternate for x in d) and all(x.lam == 0.0 for x in d)
    assert d[-1].stop and len(d) == 6 and len(s.projections) == 1 and s.projections[0]["steps"] == 150


def test_projection_logs_and_minimum_length():
    """Each projection lasts ≥ (pp + 1)·E steps, a multiple of E (Fig. 4(b))."""
    E, pp = 25, 3
    s = AlternationSchedule(E, projection_patience=pp, global_patience=1000)
    values = [0.1 * (i % 7) for i in range(60)]
    _run(s, values, E)
    s.finish(61 * E)
    assert len(s.projections) == len(s.alternations) + 1
    for p in s.projections[:-1]:
        assert p["steps"] >= (pp + 1) * E and p["steps"] % E == 0 and p["end_reason"] == "alternation"
    starts = [p["start_step"] for p in s.projections]
    ends = [p["end_step"] for p in s.projections]
    assert starts[1:] == ends[:-1] and starts[0] == 0
    assert {"step", "map_r", "lambda_eff", "projection"} <= set(s.evaluations[0])
    s.record_alternation(kcenter_seconds=0.5, covering_radius=0.2)
    assert s.alternations[-1]["kcenter_seconds"] == 0.5


def test_steps_unit():
    """ASAP-R7 alternative: the literal "60 steps" — stop once the last global improvement is ≥ 60 steps old."""
    s = AlternationSchedule(25, global_patience=60, global_patience_unit="steps")
    d = _run(s, [0.5, 0.4, 0.4, 0.4, 0.4], 25)
    assert [x.stop for x in d] == [False, False, False, True]  # 100 − 25 = 75 ≥ 60; 75 − 25 = 50 < 60


def test_anchor_last_and_state_roundtrip():
    s = AlternationSchedule(10, projection_patience=2, anchor="last")
    _run(s, [0.3, 0.5, 0.4, 0.4], 10)
    assert s.alternations[0]["anchor_step"] == 40
    t = AlternationSchedule(10, projection_patience=2, anchor="last")
    t.load_state_dict(s.state_dict())
    a, b = s.observe(50, 0.45), t.observe(50, 0.45)
    assert a == b and s.state_dict() == t.state_dict()
    with pytest.raises(ValueError, match="increase"):
        s.observe(50, 0.1)
    with pytest.raises(ValueError, match="anchor"):
        AlternationSchedule(10, anchor="first")
