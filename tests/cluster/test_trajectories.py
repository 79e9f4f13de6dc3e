"""Agent trajectories as a closed loop's source (cluster/sim/trajectories.py): the prompts' shape,
and that on the simulator their cache hit rate depends on the router, where the calibration
workload's does not (docs/design.md §8, the pareto experiment)."""

from __future__ import annotations

import numpy as np
import pytest

from cluster.sim.loadgen import Phase
from cluster.sim.profile import load_profile
from cluster.sim.scenario import NamedPhase, run_scenario
from cluster.sim.trajectories import TrajectoryShape, TrajectorySource
from cluster.sim.views import ViewSettings
from controller.detector import Thresholds
from controller.policy import PolicyTable, RegimePolicy

SHAPE = TrajectoryShape(trajectories=3, steps=2, system_tokens=8, task_tokens=5, step_tokens=4)


def test_each_step_extends_its_trajectorys_last_prompt_and_a_finished_one_starts_anew() -> None:
    source = TrajectorySource(SHAPE, seed=7)
    first = [source() for _ in range(3)]  # step 1 of trajectories 0, 1, 2
    second = [source() for _ in range(3)]  # their step 2
    third = source()  # trajectory 0, done after two steps: a new task
    system = first[0].tokens[:8]
    for a, b in zip(first, second, strict=True):
        assert len(a.tokens) == 8 + 5 + 4 and len(b.tokens) == len(a.tokens) + 4
        assert np.array_equal(b.tokens[: len(a.tokens)], a.tokens)
        assert np.array_equal(a.tokens[:8], system)  # one system prompt for every trajectory
    assert len({a.tokens[8:13].tobytes() for a in first}) == 3  # each its own task
    assert len(third.tokens) == 8 + 5 + 4 and np.array_equal(third.tokens[:8], system)
    assert not np.array_equal(third.tokens[8:13], first[0].tokens[8:13])
    assert [r.request_id for r in (*first, *second, third)] == [f"step-{k}" for k in range(1, 8)]
    assert {(r.user, r.bid, r.output_tokens) for r in (*first, *second)} == {
        ("anonymous", 0.0, 256)
    }


def test_a_seed_replays_the_same_prompts() -> None:
    a, b = TrajectorySource(SHAPE, seed=3), TrajectorySource(SHAPE, seed=3)
    assert all(np.array_equal(a().tokens, b().tokens) for _ in range(10))
    assert not np.array_equal(
        TrajectorySource(SHAPE, seed=4)().tokens, TrajectorySource(SHAPE, seed=3)().tokens
    )


def test_ideal_hit_rate_counts_each_steps_history() -> None:
    # Step 1: 8 + 5 + 4 = 17 tokens, the system prompt cached; step 2: 21, step 1's 17 cached.
    assert SHAPE.ideal_hit_rate() == pytest.approx((8 + 17) / (17 + 21))
    assert TrajectoryShape().ideal_hit_rate() == pytest.approx(0.8802083)


@pytest.mark.parametrize(
    ("field", "value"),
    [("steps", 0), ("trajectories", True), ("task_tokens", 2.5), ("step_tokens", 1 << 21)],
)
def test_a_bad_knob_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        TrajectoryShape(**{field: value})  # type: ignore[arg-type]


def _hit_rate(policy: tuple[float, float], source: TrajectorySource | None) -> float:
    p = RegimePolicy(*policy)
    result = run_scenario(
        load_profile("b200-llama70b-fp8-tp4"), "2P/4D",
        [NamedPhase("warm", Phase(6.0, 48, ramp=2.0)), NamedPhase("hold", Phase(12.0, 48))],
        adaptive=True, seed=0, views=ViewSettings(), thresholds=Thresholds(0.3, 1.0),
        table=PolicyTable(p, p, p), source=source,
    )  # fmt: skip
    hit = result.phases[1]["cache_hit_rate"]
    assert hit is not None
    return float(hit)


def test_on_two_prefill_workers_an_overlap_weighing_router_caches_more_of_a_trajectory() -> None:
    shape = TrajectoryShape(steps=4, task_tokens=1536)  # the pareto experiment's
    greedy = _hit_rate((0.0, 1.0), TrajectorySource(shape, seed=1))
    spread = _hit_rate((2.0, 1.0), TrajectorySource(shape, seed=1))  # a near-uniform draw
    # Back on the worker of its last step, a step finds all but its new observation cached;
    # drawn at random it finds the rest of its history there about half the time.
    assert greedy > spread + 0.05, (greedy, spread)
    assert greedy <= shape.ideal_hit_rate() + 0.02
    # The calibration workload (5 templates every worker caches at once) cannot tell them apart.
    assert _hit_rate((0.0, 1.0), None) == pytest.approx(_hit_rate((2.0, 1.0), None), abs=0.005)
