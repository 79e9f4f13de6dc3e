"""The window's traffic and the overload it causes (controller/traffic.py), and the re-split it
plans (controller/resplit.py): a move that starts from the queue, before TTFT says anything."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.detector import Regime
from controller.resplit import Pools, ResplitSettings, Resplitter
from controller.traffic import CLEAR_S, QueueWatch, Traffic, TrafficShape
from tests.controller.test_resplit import FakePlanner, SlowPools

SHAPE = TrafficShape(prompt_tokens=12_000.0, output_tokens=400.0, reuse=0.25)


def test_a_shape_names_the_field_it_refuses() -> None:
    with pytest.raises(ValueError, match="reuse"):
        TrafficShape(1000.0, 10.0, reuse=1.5)
    with pytest.raises(ValueError, match="prompt_tokens"):
        TrafficShape(math.nan, 10.0)
    with pytest.raises(ValueError, match="queued_prefill_tokens"):
        Traffic(1.0, SHAPE, queued_prefill_tokens=-1.0)
    with pytest.raises(ValueError, match="arrival_rate"):
        Traffic(math.inf)


def test_a_prefill_computes_what_the_cache_did_not_hold() -> None:
    assert SHAPE.new_tokens == 9_000.0
    assert TrafficShape(100.0, 1.0, reuse=1.0).new_tokens == 1.0  # never nothing


def test_the_backlog_is_demand_on_top_of_the_arrivals() -> None:
    traffic = Traffic(2.0, SHAPE, queued_prefill_tokens=90_000.0)
    # λ_eff = λ + Q/(I'·horizon) = 2 + 90,000/(9,000·10) = 3 req/s.
    assert traffic.demand_rate(10.0) == pytest.approx(3.0)
    assert Traffic(2.0, None, 90_000.0).demand_rate(10.0) == 2.0  # no shape: no token count


def test_an_overload_begins_when_the_queue_grows_and_ends_when_it_clears() -> None:
    watch = QueueWatch(window_s=2.0)
    service = 1_000.0  # tokens/s
    queue = [0.0, 5_000.0, 9_000.0, 12_000.0, 8_000.0, 4_000.0, 900.0, 0.0]
    readings = [
        watch.update(float(t), Traffic(1.0, SHAPE, q), service, busy_s=30.0)
        for t, q in enumerate(queue)
    ]
    # Grows from t = 1; shrinking from t = 4 is still its backlog; 900 tokens is under a second
    # of work (CLEAR_S), a cleared queue.
    assert readings == [False, True, True, True, True, True, False, False]
    assert CLEAR_S == 1.0


def test_the_overload_lasts_at_least_its_backlog_and_as_long_again_as_it_has_lasted() -> None:
    watch = QueueWatch(window_s=1.0)
    watch.update(0.0, Traffic(1.0, SHAPE, 2_000.0), 1_000.0, 30.0)
    watch.update(1.0, Traffic(1.0, SHAPE, 40_000.0), 1_000.0, 30.0)  # grows: begins at t = 1
    assert watch.remaining_s(1.0, 40_000.0, 1_000.0) == 40.0  # Q/μ
    assert watch.remaining_s(61.0, 5_000.0, 1_000.0) == 60.0  # A
    assert QueueWatch().remaining_s(5.0, 1e6, 1.0) == 0.0  # no overload under way


@given(st.lists(st.floats(0.0, 1e7), min_size=1, max_size=40))
def test_no_queue_is_no_overload(queue: list[float]) -> None:
    watch = QueueWatch(window_s=3.0)
    for t, q in enumerate(queue):
        overloaded = watch.update(float(t), Traffic(1.0, SHAPE, q), 1_000.0, 30.0)
        if q <= CLEAR_S * 1_000.0:
            assert not overloaded and watch.overloaded_since is None


class QueuePlanner(FakePlanner):
    """Game 1 stand-in whose capacity tracks the pools: a prefill worker computes 9,000 prompt
    tokens a second, one of SHAPE's requests (9,000 new tokens), 1 req/s within the SLO."""

    def capacity(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        return 1.0 * pools.prefill

    def prefill_rate(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        return 9_000.0 * pools.prefilling


def planned_run(
    r: Resplitter, target: SlowPools, queue: list[float], regime: Regime, rate: float = 0.9
) -> list[float]:
    """Ticks one per second with the detector at ``regime`` and λ = ``rate`` (under the
    split's SLO capacity by default: the queue alone speaks); the times moves started."""
    started = []
    for t, q in enumerate(queue):
        target.advance()
        decision = r.tick(float(t), regime, rate, traffic=Traffic(rate, SHAPE, q))
        if decision is not None:
            started.append(decision.t)
    return started


def test_a_growing_queue_moves_a_worker_before_the_detector_sees_saturation() -> None:
    # The queue grows 3,000 tokens a second on a pool that computes 9,000: the overload begins
    # at t = 4 (more than CLEAR_S of work queued), and a 10 s switch pays once it has lasted
    # more than 10 s (R = A beats Q/μ = t/3), when the arrivals and the backlog owed over it,
    # λ_eff = 0.9 + Q/(9,000·R) = 1.35 req/s, exceed 1P/5D's SLO capacity of 1 req/s; the
    # detector still reads "below" throughout.
    target = SlowPools(1, 5, switch=10.0)
    r = Resplitter(target, QueuePlanner(Pools(3, 3)), ResplitSettings(dwell_ticks=3))
    queue = [3_000.0 * t for t in range(20)]
    assert planned_run(r, target, queue, Regime.BELOW) == [15.0]
    assert "overloads 1P/5D" in r.decisions[0].reason
    assert r.decisions[0].before == Pools(1, 5) and r.decisions[0].goal == Pools(3, 3)


def test_a_queue_that_clears_before_the_switch_would_pay_takes_no_worker() -> None:
    # The same growth for 11 s: the overload lasts 7 s (from t = 4), never longer than the
    # switch, and its backlog never holds more than 3.7 s of work.
    target = SlowPools(1, 5, switch=10.0)
    r = Resplitter(target, QueuePlanner(Pools(3, 3)), ResplitSettings(dwell_ticks=3))
    burst = [3_000.0 * t for t in range(12)] + [0.0] * 20  # an 11 s burst, then nothing
    assert planned_run(r, target, burst, Regime.BELOW) == []


def test_a_planned_move_is_called_off_when_the_queue_clears_while_its_worker_drains() -> None:
    target = SlowPools(1, 5, switch=1.0)
    target.busy_ticks, target.drain_ticks = 10, 5
    r = Resplitter(target, QueuePlanner(Pools(3, 3)), ResplitSettings(dwell_ticks=2))
    queue = [6_000.0 * t for t in range(5)] + [0.0] * 3  # two seconds of work at t = 3
    assert planned_run(r, target, queue, Regime.BELOW) == [3.0]
    assert len(r.cancels) == 1 and target.cancelled


def test_demand_over_the_splits_slo_capacity_moves_a_worker_though_its_queue_clears() -> None:
    # λ = 2 req/s against 1 req/s of SLO capacity per prefill worker: 1P/5D misses its SLO in
    # steady state while its queue never holds a second of work. The episode dates from t = 0;
    # a 10 s switch pays once it has lasted longer.
    target = SlowPools(1, 5, switch=10.0)
    r = Resplitter(target, QueuePlanner(Pools(3, 3)), ResplitSettings(dwell_ticks=3))
    assert planned_run(r, target, [0.0] * 14, Regime.BELOW, rate=2.0) == [11.0]
    assert "SLO capacity" in r.decisions[0].reason


def test_a_move_that_answered_an_overload_leaves_its_episode_running() -> None:
    # After the first move (t = 11, 10 ticks busy, a 5 s cool-down), 2P/4D carries 2 req/s at
    # its SLO capacity: not short itself, but the episode began on 1P/5D, whose capacity the
    # demand still exceeds, so it has lasted since t = 0; at 2.5 req/s 2P/4D is short again
    # and the next move pays after the dwell alone, not after another switch's worth of it.
    target = SlowPools(1, 5, switch=10.0)
    r = Resplitter(
        target, QueuePlanner(Pools(3, 3)), ResplitSettings(dwell_ticks=3, cooldown_s=5.0)
    )
    started = []
    for t in range(40):
        target.advance()
        rate = 2.0 if t < 26 else 2.5
        decision = r.tick(float(t), Regime.BELOW, rate, traffic=Traffic(rate, SHAPE, 0.0))
        if decision is not None:
            started.append(decision.t)
    assert started == [11.0, 28.0]
