"""The re-split lever (controller/resplit.py): when it moves a worker, which way, and that it
never oscillates."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.detector import Regime
from controller.resplit import (
    Pools,
    ResplitDecision,
    ResplitSettings,
    Resplitter,
    Role,
    resplit_payoff,
)
from controller.traffic import TrafficShape


class FakePools:
    """A target whose re-splits take ``busy_ticks`` ticks (drain + warm-up) to finish, the
    first ``drain_ticks`` of them draining (a move can be called off then); it moves up to
    ``step`` workers at once."""

    def __init__(
        self, prefill: int, decode: int, busy_ticks: int = 3, drain_ticks: int = 0, step: int = 1
    ) -> None:  # fmt: skip
        self.split = Pools(prefill, decode)
        self.busy_ticks = busy_ticks
        self.drain_ticks = drain_ticks
        self.step = step
        self._left = 0
        self._k = 1
        self._to: Role | None = None
        self.calls: list[tuple[Role, str]] = []
        self.sizes: list[int] = []  # workers each move took
        self.cancelled: list[str] = []

    def pools(self) -> Pools:
        if self._left:  # the moving workers count in neither pool
            p, d, k = self.split.prefill, self.split.decode, self._k
            return Pools(p - k * (self._to == "decode"), d - k * (self._to == "prefill"))
        return self.split

    def max_step(self) -> int:
        return self.step

    def resplitting(self) -> bool:
        return self._left > 0

    def switch_s(self) -> float:
        return 0.0  # a switch that costs nothing: these tests are about when and which way

    def cancel(self, reason: str) -> bool:
        if not self._left or self.busy_ticks - self._left >= self.drain_ticks:
            return False
        self._left, self._to = 0, None
        self.cancelled.append(reason)
        return True

    def resplit(self, to_role: Role, reason: str, workers: int = 1) -> None:
        assert not self._left, "a re-split was started while one was in progress"
        assert 1 <= workers <= self.step
        self.calls.append((to_role, reason))
        self.sizes.append(workers)
        self._to, self._left, self._k = to_role, self.busy_ticks, workers

    def advance(self) -> None:
        """One tick of the target's own work: the move finishes when its ticks run out."""
        if self._left:
            self._left -= 1
            if not self._left:
                p, d = self.split.prefill, self.split.decode
                up = self._k if self._to == "prefill" else -self._k
                self.split = Pools(p + up, d - up)


class FakePlanner:
    """Game 1 stand-in: always ``goal``; a split carries 20 req/s per prefill worker."""

    PER_PREFILL = 20.0

    def __init__(self, goal: Pools) -> None:
        self.goal = goal

    def best_split(self, arrival_rate: float, shape: TrafficShape | None = None) -> Pools:
        return self.goal

    def capacity(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        return self.PER_PREFILL * pools.prefill

    def prefill_rate(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        return 1000.0 * pools.prefilling  # prompt tokens/s: 1,000 per prefill worker


def always(goal: Pools) -> FakePlanner:
    return FakePlanner(goal)


Tick = tuple[Regime, float, float, float]  # regime, poa_routing, poa_capacity, λ


def run(resplitter: Resplitter, target: FakePools, ticks: list[Tick]) -> list[ResplitDecision]:
    made = []
    for t, (regime, routing, capacity, rate) in enumerate(ticks):
        target.advance()
        decision = resplitter.tick(float(t), regime, rate, routing, capacity)
        if decision is not None:
            made.append(decision)
    return made


CAPACITY = (Regime.SATURATED, 1.1, 10.0, 60.0)  # poa_capacity ≫ poa_routing
ROUTING = (Regime.SATURATED, 3.0, 4.0, 60.0)  # saturated, but routing explains it
CALM = (Regime.BELOW, 1.0, 1.2, 10.0)  # demand one prefill worker carries with headroom
# TTFT calm (the re-split worked) but demand still needs the extra prefill workers.
RELIEVED = (Regime.BELOW, 1.0, 1.5, 60.0)


def test_capacity_bound_saturation_moves_one_group_to_prefill_after_the_dwell() -> None:
    target = FakePools(1, 5)
    r = Resplitter(target, always(Pools(3, 3)), ResplitSettings(dwell_ticks=4, cooldown_s=5))
    made = run(r, target, [CAPACITY] * 4)
    assert len(made) == 1 and made[0].t == 3.0  # the fourth tick in a row
    assert made[0].to_role == "prefill" and made[0].before == Pools(1, 5)
    assert made[0].goal == Pools(3, 3)
    assert "poa_capacity" in made[0].reason and target.calls[0][0] == "prefill"


def test_routing_bound_saturation_never_resplits() -> None:
    target = FakePools(1, 5)
    r = Resplitter(target, always(Pools(3, 3)), ResplitSettings(dwell_ticks=2))
    assert run(r, target, [ROUTING] * 50) == []


def test_one_group_at_a_time_with_a_cooldown_between_moves() -> None:
    target = FakePools(1, 5, busy_ticks=3)
    settings = ResplitSettings(dwell_ticks=2, cooldown_s=10)
    r = Resplitter(target, always(Pools(3, 3)), settings)
    made = run(r, target, [CAPACITY] * 40)
    assert [d.to_role for d in made] == ["prefill", "prefill"]  # 1P → 2P → 3P, then Game 1 holds
    first, second = made
    # The second waits for the first to finish (3 ticks) and the cool-down after it (10 s).
    assert second.t - first.t >= 3 + 10
    assert target.split == Pools(3, 3)


def test_game_one_decides_how_far() -> None:
    target = FakePools(1, 5)
    r = Resplitter(target, always(Pools(1, 5)), ResplitSettings(dwell_ticks=1, cooldown_s=0))
    assert run(r, target, [CAPACITY] * 20) == []  # already at Game 1's split: nothing to do


def test_back_toward_the_home_split_when_load_falls_and_never_below_it() -> None:
    target = FakePools(1, 5, busy_ticks=2)
    settings = ResplitSettings(dwell_ticks=2, release_ticks=5, cooldown_s=3)
    r = Resplitter(target, always(Pools(3, 3)), settings)
    made = run(r, target, [CAPACITY] * 30 + [CALM] * 60)
    assert [d.to_role for d in made] == ["prefill", "prefill", "decode", "decode"]
    assert target.split == Pools(1, 5)  # home, and no further


def test_transition_at_high_demand_neither_moves_up_nor_back() -> None:
    target = FakePools(2, 4)
    settings = ResplitSettings(dwell_ticks=1, release_ticks=1, cooldown_s=0)
    r = Resplitter(target, always(Pools(3, 3)), settings, home=Pools(1, 5))
    assert run(r, target, [(Regime.TRANSITION, 1.0, 10.0, 60.0)] * 30) == []


def test_a_calm_ttft_after_the_move_is_no_reason_to_give_capacity_back() -> None:
    """The re-split brings TTFT below θ1; demand has not fallen, so the workers stay."""
    target = FakePools(1, 5, busy_ticks=2)
    settings = ResplitSettings(dwell_ticks=2, release_ticks=3, cooldown_s=1)
    r = Resplitter(target, always(Pools(2, 4)), settings)
    made = run(r, target, [CAPACITY] * 6 + [RELIEVED] * 60)
    assert [d.to_role for d in made] == ["prefill"] and target.split == Pools(2, 4)


def test_the_move_back_waits_for_headroom_on_the_smaller_split() -> None:
    """2P carry 40 req/s, 1P 20: a move back needs λ <= 0.8 x 20 = 16 req/s."""
    settings = ResplitSettings(release_ticks=2, cooldown_s=0)
    for rate, moves in ((16.0, ["decode"]), (16.5, [])):
        target = FakePools(2, 4)
        r = Resplitter(target, always(Pools(2, 4)), settings, home=Pools(1, 5))
        made = run(r, target, [(Regime.BELOW, 1.0, 1.0, rate)] * 10)
        assert [d.to_role for d in made] == moves, rate


def test_the_decode_pool_keeps_its_minimum() -> None:
    target = FakePools(1, 1)
    r = Resplitter(target, always(Pools(2, 0)), ResplitSettings(dwell_ticks=1, cooldown_s=0))
    assert run(r, target, [CAPACITY] * 10) == []


@given(
    st.lists(
        st.sampled_from([CAPACITY, ROUTING, CALM, RELIEVED, (Regime.TRANSITION, 1.0, 5.0, 30.0)]),
        max_size=200,
    ),
    st.integers(1, 5),
    st.integers(1, 20),
    st.integers(1, 4),
    st.integers(0, 8),
)
def test_never_oscillates(ticks, dwell, release, busy, cooldown) -> None:  # type: ignore[no-untyped-def]
    """Whatever the signals: no move starts while one is in progress, consecutive moves are at
    least the move's duration plus the cool-down apart, and the pools stay within bounds."""
    target = FakePools(1, 5, busy_ticks=busy)
    settings = ResplitSettings(dwell_ticks=dwell, release_ticks=release, cooldown_s=cooldown)
    r = Resplitter(target, always(Pools(3, 3)), settings)
    made = run(r, target, ticks)  # FakePools asserts no overlapping re-split
    for a, b in itertools.pairwise(made):
        assert b.t - a.t >= busy + cooldown
    assert 1 <= target.split.prefill <= 3 and target.split.decode >= 3
    # A move back needs `release` calm ticks since the last non-calm one: never right after a
    # move up that was itself triggered by saturation.
    for a, b in itertools.pairwise(made):
        if (a.to_role, b.to_role) == ("prefill", "decode"):
            assert b.t - a.t >= release


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dominance", 0.5),
        ("dominance", float("nan")),
        ("cooldown_s", -1.0),
        ("cooldown_s", float("inf")),
        ("dwell_ticks", 0),
        ("release_ticks", 1.5),
        ("release_fraction", 1.5),
        ("release_fraction", -0.1),
        ("min_decode", 0),
        ("min_prefill", True),
    ],
)
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ResplitSettings(**{field: value})  # type: ignore[arg-type]


def test_a_non_finite_arrival_rate_is_refused() -> None:
    r = Resplitter(FakePools(1, 5), always(Pools(2, 4)))
    with pytest.raises(ValueError, match="arrival_rate"):
        r.tick(0.0, Regime.SATURATED, float("nan"), 1.0, 5.0)


class SlowPools(FakePools):
    """A target whose switch takes ``switch`` seconds (one tick is one second here)."""

    def __init__(self, prefill: int, decode: int, switch: float) -> None:
        super().__init__(prefill, decode, busy_ticks=max(1, int(switch)))
        self.switch = switch

    def switch_s(self) -> float:
        return self.switch


class AdditivePlanner(FakePlanner):
    """A capacity every worker adds to (20 req/s per prefill, 5 per decode worker): losing a
    decode worker for the switch costs, unlike Game 1's min(P·κ_P, D·κ_D)."""

    def capacity(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        return 20.0 * pools.prefill + 5.0 * pools.decode


def test_a_move_up_waits_until_the_overload_has_lasted_one_switch() -> None:
    target = SlowPools(1, 5, switch=10.0)
    r = Resplitter(target, always(Pools(3, 3)), ResplitSettings(dwell_ticks=4))
    made = run(r, target, [CAPACITY] * 14)
    # Capacity-bound from t = 0 (the dwell is met at t = 3), but the move pays only once the
    # overload has lasted more than the 10 s switch: R = 11 s at t = 11.
    assert [d.t for d in made] == [11.0] and r.unpaid == 8
    reason = "1 worker(s) at once pay for their 10 s switch, the overload likely lasting 11 s"
    assert reason in made[0].reason


def test_a_spike_shorter_than_the_switch_takes_no_worker_away() -> None:
    target = SlowPools(1, 5, switch=10.0)
    r = Resplitter(target, always(Pools(3, 3)), ResplitSettings(dwell_ticks=4))
    assert run(r, target, [CAPACITY] * 9 + [CALM] * 20 + [CAPACITY] * 9) == []
    assert target.calls == []  # each overload was over before it had lasted a switch


def test_a_switch_that_costs_capacity_must_be_paid_back() -> None:
    # κ = 20P + 5D at λ = 60: 35 served on 1P/3D, 30 while a decode worker moves (loss 5),
    # 50 after (gain 15); a 9 s switch: benefit 15·(R − 9) > cost 5·9 once R > 12.
    planner = AdditivePlanner(Pools(2, 2))
    payoff = resplit_payoff(planner, Pools(1, 3), 60.0, 12.0, 9.0)
    assert (payoff.gain_rps, payoff.loss_rps) == (15.0, 5.0) and not payoff.pays
    assert resplit_payoff(planner, Pools(1, 3), 60.0, 12.5, 9.0).pays
    target = SlowPools(1, 3, switch=9.0)
    r = Resplitter(target, planner, ResplitSettings(dwell_ticks=2))
    made = run(r, target, [CAPACITY] * 16)
    assert [d.t for d in made] == [13.0]


def test_game_ones_capacity_never_gains_what_the_switch_lost() -> None:
    # With κ = min(P·κ_P, D·κ_D), a decode worker whose absence binds during the switch also
    # binds after it: the cost term is zero whenever the gain is positive.
    class MinPlanner(FakePlanner):
        def capacity(self, pools: Pools, shape: TrafficShape | None = None) -> float:
            return min(20.0 * pools.prefill, 15.0 * pools.decode)

    for p, d in itertools.product(range(1, 6), range(2, 8)):
        payoff = resplit_payoff(MinPlanner(Pools(p, d)), Pools(p, d), 1000.0, 60.0, 30.0)
        assert payoff.loss_rps == 0.0 or payoff.gain_rps <= 0.0, (p, d)


def test_the_overload_is_dated_from_its_backlog_when_that_began_earlier() -> None:
    # The queue formed 8 s before the regime turned saturated (the detector confirms late):
    # with a 10 s switch the move pays 3 s into the saturated stretch, not 11 s.
    target = SlowPools(1, 5, switch=10.0)
    r = Resplitter(target, always(Pools(3, 3)), ResplitSettings(dwell_ticks=1))
    regime, routing, capacity, rate = CAPACITY
    starts = []
    for t in range(6):
        decision = r.tick(float(t), regime, rate, routing, capacity, backlog_since=-8.0)
        if decision is not None:
            starts.append(decision.t)
    assert starts == [3.0]


def test_a_move_up_whose_overload_ends_while_its_worker_drains_is_called_off() -> None:
    target = FakePools(1, 5, busy_ticks=6, drain_ticks=3)
    r = Resplitter(target, always(Pools(2, 4)), ResplitSettings(dwell_ticks=2, cooldown_s=5))
    made = run(r, target, [CAPACITY] * 2 + [RELIEVED] * 12)
    assert [d.to_role for d in made] == ["prefill"]
    assert len(target.cancelled) == 1 and "overload ended" in target.cancelled[0]
    assert [c.t for c in r.cancels] == [2.0]  # the first calm tick, while it drained
    assert target.split == Pools(1, 5) and not target.resplitting()


def test_a_warm_up_runs_to_its_end_and_a_move_back_is_never_called_off() -> None:
    target = FakePools(1, 5, busy_ticks=6, drain_ticks=2)
    r = Resplitter(target, always(Pools(2, 4)), ResplitSettings(dwell_ticks=2, cooldown_s=5))
    run(r, target, [CAPACITY] * 4 + [RELIEVED] * 8)  # calm only once the worker has drained
    assert target.cancelled == [] and r.cancels == []
    assert target.split == Pools(2, 4)
    back = FakePools(2, 4, busy_ticks=6, drain_ticks=3)
    settings = ResplitSettings(dwell_ticks=2, release_ticks=2, cooldown_s=0)
    r = Resplitter(back, always(Pools(2, 4)), settings, home=Pools(1, 5))
    made = run(r, back, [CALM] * 10)  # demand fell: back home, below all along
    assert [d.to_role for d in made] == ["decode"] and back.cancelled == []
    assert back.split == Pools(1, 5)


def test_a_move_up_takes_at_once_the_workers_that_pay_most() -> None:
    # Prefill-bound (κ = 20·P): at λ = 60 on 1P/5D each worker moved gains 20 req/s and none
    # loses any until 3P carries the demand; Game 1's 4P/2D would add nothing more.
    target = FakePools(1, 5, busy_ticks=3, step=5)
    r = Resplitter(target, always(Pools(4, 2)), ResplitSettings(dwell_ticks=2, cooldown_s=0))
    made = run(r, target, [CAPACITY] * 12)
    assert [(d.before, d.workers) for d in made] == [(Pools(1, 5), 2)]
    assert target.sizes == [2] and target.split == Pools(3, 3)
    assert "2 worker(s) at once" in made[0].reason
    # A target that moves one worker at a time gets there in two moves.
    one = FakePools(1, 5, busy_ticks=3, step=1)
    r = Resplitter(one, always(Pools(4, 2)), ResplitSettings(dwell_ticks=2, cooldown_s=0))
    assert [d.workers for d in run(r, one, [CAPACITY] * 12)] == [1, 1]
    assert one.split == Pools(3, 3)


def test_the_payoff_of_several_workers_weighs_one_switch() -> None:
    planner = AdditivePlanner(Pools(3, 1))
    # κ = 20P + 5D at λ = 100: 45 on 1P/5D; moving k: 45 − 5k; after: 45 + 15k.
    two = resplit_payoff(planner, Pools(1, 5), 100.0, 30.0, 10.0, workers=2)
    assert (two.gain_rps, two.loss_rps, two.workers) == (30.0, 10.0, 2)
    assert two.net == 30.0 * 20.0 - 10.0 * 10.0
    with pytest.raises(ValueError, match="1 to 4 decode workers"):
        resplit_payoff(planner, Pools(1, 5), 100.0, 30.0, 10.0, workers=5)
