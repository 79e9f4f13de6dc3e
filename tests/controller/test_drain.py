"""Backlogs and their ends (controller.drain), and what a drain does to the detector
(SaturationDetector.relax) and the controller (Controller.drained)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.controller import Controller
from controller.detector import Regime, SaturationDetector, Thresholds
from controller.drain import Drain, DrainWatch, TickWaits, calm_limit_s
from controller.policy import PolicyTable
from router import Policy

TH = Thresholds(theta1=0.5, theta2=2.0)


class Target:
    def __init__(self) -> None:
        self.calls: list[tuple[float, float, int]] = []

    def set_policy(self, policy: Policy) -> None:
        self.calls.append((policy.tau, policy.omega, policy.version))


def feed(watch: DrainWatch, readings: list[bool | None], start: float = 0.0) -> list[Drain]:
    out = []
    for k, drained in enumerate(readings):
        drain = watch.update(start + k, drained)
        if drain is not None:
            out.append(drain)
    return out


def test_a_backlog_that_lasted_ends_on_the_second_drained_tick() -> None:
    watch = DrainWatch()
    (drain,) = feed(watch, [True] * 3 + [False] * 5 + [True] * 4)
    assert drain == Drain(t=9.0, since=8.0, backlog_s=5.0)
    assert list(watch.drains) == [drain] and not watch.backlogged


def test_short_queues_and_single_empty_ticks_are_not_drains() -> None:
    watch = DrainWatch()
    # Two ticks of queue (shorter than a backlog), then a backlog broken by one empty tick.
    assert feed(watch, [False, False, True, True, False, False, False, True, False, False]) == []
    assert watch.backlogged
    # Ticks without a signal change nothing either way.
    assert feed(watch, [None, True, None, None], start=10.0) == []
    assert watch.backlogged
    assert [d.since for d in feed(watch, [True], start=14.0)] == [11.0]


@given(st.lists(st.one_of(st.booleans(), st.none()), max_size=60))
def test_drains_follow_backlogs_one_for_one(readings: list[bool | None]) -> None:
    watch = DrainWatch(episode_ticks=3, drain_ticks=2)
    drains = feed(watch, readings)
    known = [(t, r) for t, r in enumerate(readings) if r is not None]  # None: no reading
    times = [t for t, _ in known]
    previous_end = -1.0
    for drain in drains:
        # since and t: two drained readings in a row, right after a reading of queue ...
        i = times.index(int(drain.since))
        assert known[i][1] is True and known[i + 1] == (int(drain.t), True)
        assert i > 0 and known[i - 1][1] is False
        # ... and since the previous drain, a queue at least three readings long.
        between = "".join("q" if not r else "." for t, r in known if previous_end < t < drain.since)
        assert "qqq" in between and drain.backlog_s >= 2.0
        previous_end = drain.t


def test_bad_readings_are_refused() -> None:
    with pytest.raises(ValueError, match="episode_ticks"):
        DrainWatch(episode_ticks=0)
    with pytest.raises(ValueError, match="drain_ticks"):
        DrainWatch(drain_ticks=True)  # type: ignore[arg-type]
    watch = DrainWatch()
    with pytest.raises(ValueError, match="now"):
        watch.update(float("nan"), True)
    with pytest.raises(ValueError, match="drained"):
        watch.update(1.0, 1)  # type: ignore[arg-type]


def saturated_detector() -> SaturationDetector:
    d = SaturationDetector(TH, min_samples=5, dwell=3)
    for second in range(20):  # requests that each waited 8 s in a queue
        for k in range(10):
            d.observe(second + k / 10, 8.0)
        d.tick(second + 1.0)
    assert d.regime == Regime.SATURATED
    return d


def test_relax_forgets_the_queues_samples_and_steps_down_at_once() -> None:
    d = saturated_detector()
    for k in range(10):  # calm requests that arrived after the drain at 20.5 s
        d.observe(20.6 + k / 20, 0.05)
    assert d.relax(21.5, since=20.5) == Regime.BELOW
    assert d.smoothed_p99 == pytest.approx(0.05) and d.switches == 2
    # The queue's last requests get their first tokens later: they never count.
    dropped = d.drain_dropped
    d.observe(22.0, 9.0)
    assert d.drain_dropped == dropped + 1 and d.tick(22.0) == Regime.BELOW
    assert d.last_p99 == pytest.approx(0.05)


def test_relax_with_too_few_samples_reads_an_empty_queue_as_calm() -> None:
    d = saturated_detector()
    assert d.relax(21.0, since=20.5) == Regime.BELOW and d.smoothed_p99 == 0.0
    with pytest.raises(ValueError, match="since"):
        d.relax(22.0, since=23.0)
    with pytest.raises(ValueError, match="now"):
        d.relax(21.5, since=20.0)  # the clock never goes back


def test_relax_keeps_a_queue_that_is_still_there() -> None:
    d = saturated_detector()
    for k in range(10):  # requests that arrived after "since" and still waited 8 s
        d.observe(29.0 + k / 10, 8.0)
    assert d.relax(30.0, since=20.5) == Regime.SATURATED


def test_the_controller_pushes_the_calm_policy_on_a_drain() -> None:
    target = Target()
    control = Controller(saturated_detector(), PolicyTable(), target)
    control.start(20.0)
    assert control.drained(Drain(t=22.0, since=21.0, backlog_s=15.0)) == Regime.BELOW
    assert control.changes[-1].cause == "drain" and target.calls[-1] == (0.0, 1.0, 2)
    before = len(control.changes)
    control.drained(Drain(t=23.0, since=22.0, backlog_s=1.0))  # already below: nothing to push
    assert len(control.changes) == before


def test_a_tick_reads_drained_only_with_calm_evidence() -> None:
    waits = TickWaits()
    calm = dict(queued=False, waiting_s=0.1, idle=False, limit_s=0.4)
    assert not waits.reading(**calm)  # nobody answered: everyone may be decoding
    assert waits.reading(**{**calm, "idle": True})  # nothing in flight at all
    waits.answered(0.2)
    assert waits.reading(**calm)
    assert not waits.reading(**calm)  # each tick starts afresh
    waits.answered(0.2), waits.answered(0.9)  # the queue's last request, during the tick
    assert not waits.reading(**calm)
    waits.answered(0.2)
    assert not waits.reading(**{**calm, "waiting_s": 0.5})  # someone still waits
    waits.answered(0.2)
    assert not waits.reading(**{**calm, "queued": True})  # a queue in front of routing
    detector = SaturationDetector(TH, hysteresis=0.2)
    assert calm_limit_s(detector.thresholds, detector.hysteresis) == pytest.approx(0.4)
