"""The PoA estimator (games/poa.py) and its exact optimum (games/assignment.py): the five required
properties of docs/design.md §3, each a test, plus the solver's equality with the Hungarian
reference and brute force. No timed assertions: bench/poa.py measures speed."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.events import RouteEvent
from cluster.sim.cluster import SimCluster
from cluster.sim.control import ControlLoop, TickSample
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.profile import load_profile
from cluster.sim.scenario import template_source, unloaded_ttft
from cluster.wire import decode, encode
from games.assignment import optimal_cost, optimal_cost_hungarian
from games.join import EventJoiner
from games.poa import (
    CandidateLoad,
    PoaEstimator,
    WindowRequest,
    estimate_parts,
    fresh_routing,
    poa_hat,
)
from games.poa_model import assignment_cost

PROFILE, TOPOLOGY = "b200-llama70b-fp8-tp4", "1P/5D"

# -- the exact optimum -----------------------------------------------------------------------


def _brute_force(P: np.ndarray, base: np.ndarray, svc: np.ndarray) -> float:
    """Minimum over every assignment: a worker's slot costs sum to n·base + svc·n(n−1)/2."""
    n, W = P.shape
    best = math.inf
    for a in itertools.product(range(W), repeat=n):
        counts = np.bincount(a, minlength=W)
        cost = sum(P[r, w] for r, w in enumerate(a))
        cost += float(np.sum(counts * base + svc * counts * (counts - 1) / 2))
        best = min(best, cost)
    return best


@st.composite
def instances(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = draw(st.integers(min_value=0, max_value=6))
    W = draw(st.integers(min_value=1, max_value=3))
    cell = st.one_of(st.sampled_from([0.0, 1.0, 2.0]), st.floats(0, 5, allow_nan=False))
    P = np.array(
        draw(st.lists(st.lists(cell, min_size=W, max_size=W), min_size=n, max_size=n)), dtype=float
    ).reshape(n, W)
    base = np.array(draw(st.lists(st.floats(0, 3), min_size=W, max_size=W)))
    svc = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5]), min_size=W, max_size=W)))
    return P, base, svc


@given(instances())
@settings(max_examples=200, deadline=None)
def test_slot_flow_equals_hungarian_equals_enumeration(instance) -> None:
    P, base, svc = instance
    expected = _brute_force(P, base, svc)
    assert optimal_cost(P, base, svc) == pytest.approx(expected, abs=1e-9)
    assert optimal_cost_hungarian(P, base, svc) == pytest.approx(expected, abs=1e-9)


def test_slot_flow_equals_hungarian_on_larger_windows_with_forbidden_pairs() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n, W = int(rng.integers(20, 60)), int(rng.integers(2, 6))
        P = rng.uniform(0, 0.2, (n, W))
        forbid = rng.random((n, W)) < 0.25
        forbid[np.arange(n), rng.integers(0, W, n)] = False
        P[forbid] = np.inf
        base, svc = rng.uniform(0.01, 0.1, W), rng.uniform(0.0, 0.02, W)
        assert optimal_cost(P, base, svc) == pytest.approx(optimal_cost_hungarian(P, base, svc))


# -- property 1: poa_hat >= 1 by construction --------------------------------------------------

COUNT = st.integers(min_value=0, max_value=50_000)


@st.composite
def windows(draw: st.DrawFn) -> tuple[list[WindowRequest], float | None]:
    """Any window the joiner can emit: candidates a subset of the pool holding the chosen
    worker, loads and latencies anywhere ≥ 0 (zeros included), first token at or after routing,
    routing times with ties (a router routes bursts at one instant); with or without an anchor."""
    W = draw(st.integers(min_value=1, max_value=4))
    n = draw(st.integers(min_value=1, max_value=24))
    window = []
    for i in range(n):
        chosen = draw(st.integers(0, W - 1))
        others = draw(st.sets(st.integers(0, W - 1), max_size=W))
        candidates = {
            w: CandidateLoad(draw(COUNT), draw(COUNT), draw(COUNT)) for w in others | {chosen}
        }
        routed = draw(st.sampled_from([0.0, 0.5, 1.0])) + 0.01 * draw(st.integers(0, 100))
        latency = draw(st.one_of(st.just(0.0), st.floats(0.0, 30.0, allow_nan=False)))
        window.append(WindowRequest(f"r{i}", chosen, routed, routed + latency, latency, candidates))
    unloaded = draw(st.one_of(st.none(), st.floats(0.0, 1.0, allow_nan=False)))
    return window, unloaded


@given(windows())
@settings(max_examples=300, deadline=None)
def test_poa_is_at_least_one_by_construction(case) -> None:
    """One cost model: the router's assignment costs exactly Σℓ on it, OPT is the better of it
    and the fresh router's assignment costed the same way, and the floor lies below it
    (games/poa.py)."""
    window, unloaded = case
    est = poa_hat(window, unloaded_latency_s=unloaded)
    realised = math.fsum(r.latency for r in window)
    assert est.realised == pytest.approx(realised, rel=1e-12)
    assert est.router_cost == pytest.approx(realised, rel=1e-9, abs=1e-12)
    assert est.poa_hat >= 1 - 1e-12
    assert est.poa_routing >= 1 and est.poa_capacity >= 1
    assert est.floor_cost <= est.optimal_cost <= realised
    if math.isfinite(est.poa_hat):
        assert est.poa_hat == pytest.approx(est.poa_routing * est.poa_capacity, rel=1e-9)
    if realised > 0:
        arrays, model, queue, cf = estimate_parts(window, unloaded_latency_s=unloaded)
        assert np.all(model.theta >= 0) and np.all(queue.phi >= 0)
        assert queue.per_request_s >= 0 and queue.per_token_s >= 0
        assert np.all(cf.work >= 0) and np.all(cf.floor >= 0) and np.all(cf.router_wait >= 0)
        fresh = fresh_routing(arrays, cf)
        candidates = np.isfinite(cf.base)
        assert np.all(candidates[np.arange(arrays.n), fresh])  # only candidates are options
        assert est.optimal_cost <= assignment_cost(cf, arrays, fresh) + 1e-9 * realised


def test_edge_cases() -> None:
    empty = poa_hat([])
    assert (empty.n, empty.poa_hat, empty.poa_routing, empty.poa_capacity) == (0, 1.0, 1.0, 1.0)
    lines = {4: CandidateLoad(100, 0, 8)}
    alone = [WindowRequest(f"r{i}", 4, i, i + 0.1 * i, 0.1 * i, lines) for i in range(5)]
    one_worker = poa_hat(alone)
    assert one_worker.poa_routing == 1.0 and one_worker.workers == (4,)
    # A worker that is nobody's candidate is nobody's option: it joins the pool, changes nothing.
    wider = poa_hat(alone, workers=[9])
    assert wider.workers == (4, 9) and wider.poa_hat == one_worker.poa_hat
    pair = {0: CandidateLoad(0, 0, 0), 1: CandidateLoad(0, 0, 0)}
    zeros = poa_hat([WindowRequest(f"r{i}", i % 2, i, i, 0.0, pair) for i in range(3)])
    assert (zeros.poa_hat, zeros.poa_routing, zeros.poa_capacity) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="latency"):
        WindowRequest("x", 0, 0.0, 1.0, -1.0, pair)
    with pytest.raises(ValueError, match="breakdown"):
        WindowRequest("x", 2, 0.0, 1.0, 1.0, pair)
    with pytest.raises(ValueError, match="decode_blocks"):
        CandidateLoad(1, 1, -1)
    with pytest.raises(ValueError, match="unloaded"):
        poa_hat([], unloaded_latency_s=float("nan"))


# -- property 2: timely ------------------------------------------------------------------------


def test_window_is_entered_at_first_token_and_ages_by_routing_time() -> None:
    est = PoaEstimator(max_requests=3, max_age_s=5.0)
    lines = {0: CandidateLoad(0, 0, 0), 1: CandidateLoad(0, 0, 0)}
    # First tokens arrive out of routing order; the window keeps the latest-routed three.
    for i in (2, 0, 5, 1, 4, 3):
        est.add(WindowRequest(f"r{i}", 0, float(i), 10.0, 10.0 - i, lines))
    assert [r.request_id for r in est.window()] == ["r3", "r4", "r5"]
    assert [r.request_id for r in est.window(now=9.0)] == ["r4", "r5"]  # routed ≥ 4.0
    assert est.estimate(now=100.0).n == 0
    for bad in (dict(max_requests=0), dict(max_age_s=0.0), dict(unloaded_latency_s=-1.0)):
        with pytest.raises(ValueError):
            PoaEstimator(**bad)  # type: ignore[arg-type]


def test_a_drain_cuts_the_window_and_keeps_the_queues_requests_out() -> None:
    est = PoaEstimator(max_requests=10, max_age_s=30.0)
    lines = {0: CandidateLoad(0, 0, 0)}
    for i in range(4):  # routed at 0..3 s, during a backlog
        est.add(WindowRequest(f"q{i}", 0, float(i), 9.0, 9.0 - i, lines))
    est.forget_before(3.0)
    assert [r.request_id for r in est.window()] == ["q3"]
    # The queue's last request gets its first token after the drain: it stays out.
    est.add(WindowRequest("late", 0, 2.5, 9.5, 7.0, lines))
    est.add(WindowRequest("calm", 0, 4.0, 4.1, 0.1, lines))
    assert [r.request_id for r in est.window()] == ["q3", "calm"]
    est.forget_before(1.0)  # an older drain moves nothing back
    assert est.since == 3.0 and len(est.window()) == 2
    with pytest.raises(ValueError, match="since"):
        est.forget_before(float("nan"))


def _run(phases: list[Phase], seed: int = 0) -> tuple[list[TickSample], list[float]]:
    """The simulator under the control loop (no controller); per tick, the estimate and the
    mean TTFT over the estimator's own window."""
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, TOPOLOGY, seed=seed)
    load = ClosedLoop(cluster, template_source(profile, seed), phases)
    estimator = PoaEstimator(256, 30.0, unloaded_latency_s=unloaded_ttft(profile))
    means: list[float] = []

    def seen(sample: TickSample) -> None:
        window = estimator.window(sample.t)
        means.append(float(np.mean([r.latency for r in window])) if window else math.nan)

    loop = ControlLoop(cluster, None, estimator, until=load.end, on_tick=seen)
    cluster.loop.run(load.end)
    return loop.timeline, means


def test_a_load_step_shows_in_poa_hat_within_two_ticks() -> None:
    """C = 32 for 20 s, then a step to 512 clients. The step's first requests get their first
    token after one prefill iteration of the burst (~1.4 s): by the second tick after the step
    poa_hat is far above anything the calm phase read. (Keyed by completion, the old window saw
    them ~2.2 s of decoding later, and aged them by completion for 10 s more.)"""
    step = 20.0
    timeline, _ = _run([Phase(step, 32, ramp=2.0), Phase(6.0, 512)])
    calm = [s.poa_hat for s in timeline if 5.0 <= s.t <= step]
    after = {round(s.t): s.poa_hat for s in timeline if s.t > step}
    assert max(calm) < 1.5  # calm: the little queueing a C = 32 closed loop has
    assert after[step + 2] > 5 * max(calm), (max(calm), after)


# -- property 3: stable ------------------------------------------------------------------------


def _cv(values: list[float]) -> float:
    x = np.asarray(values)
    return float(np.std(x) / np.mean(x))


def test_steady_saturation_gives_a_steady_estimate() -> None:
    """70B 1P/5D held at C = 512 (saturated: TTFT ~9.5 s, all of it the prefill queue). From
    t = 25 s on, poa_hat varies window to window no more than twice the window's mean TTFT does,
    and reads the queue: poa_capacity ≫ 1, poa_routing ≈ 1 (one shared prefill worker: where a
    request decodes does not change its TTFT)."""
    timeline, means = _run([Phase(45.0, 512)])
    steady = [(s, m) for s, m in zip(timeline, means, strict=True) if s.t >= 25.0]
    hat = [s.poa_hat for s, _ in steady]
    ttft = [m for _, m in steady]
    assert _cv(hat) <= 2 * _cv(ttft), (_cv(hat), _cv(ttft))
    assert min(s.poa_capacity for s, _ in steady) > 50
    assert max(s.poa_routing for s, _ in steady) < 1.1


# -- property 4: sensitive where routing matters, quiet where it does not ----------------------


def standing_queue(
    seed: int, n: int, backlog: int, workers: int, spacing: float
) -> list[WindowRequest]:
    """Every request goes to worker 0, a FIFO server (service 50 ms, jitter 10%) that starts
    with ``backlog`` requests routed before the window; the other workers idle. The router's
    view follows: active prefill tokens and decode blocks of the requests queued on worker 0,
    none elsewhere. ``spacing`` = 1 keeps the queue standing, < 1 makes it build."""
    rng = np.random.default_rng(seed)
    service, uncached = 0.05, 64
    free_at = backlog * service
    queued_until = [(k + 1) * service for k in range(backlog)]
    window = []
    for i in range(n):
        t = i * service * spacing
        done = max(t, free_at) + service * rng.lognormal(-0.005, 0.1)
        free_at = done
        ahead = sum(1 for e in queued_until if e > t)
        lines = {
            w: CandidateLoad(
                uncached, ahead * uncached if w == 0 else 0, 8 * ahead if w == 0 else 0
            )
            for w in range(workers)
        }
        window.append(WindowRequest(f"r{i}", 0, t, done, done - t, lines))
        queued_until.append(done)
    return window


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(40, 120),
    backlog=st.integers(5, 20),
    workers=st.integers(2, 4),
)
@settings(max_examples=25, deadline=None)
def test_an_idle_worker_beside_a_standing_queue_is_a_routing_loss(
    seed, n, backlog, workers
) -> None:
    """With the unloaded latency (50 ms here, the service time) the model knows a constant
    0.5-1 s is queueing, not slow service, and that the queue is worker 0's own: moving requests
    to an idle worker would recover at least a third of the latency."""
    window = standing_queue(seed, n, backlog, workers, spacing=1.0)
    est = poa_hat(window, unloaded_latency_s=0.05)
    assert est.poa_routing >= 1.5, est.model


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(40, 120), workers=st.integers(2, 4))
@settings(max_examples=25, deadline=None)
def test_a_building_queue_is_a_routing_loss_without_an_anchor(seed, n, workers) -> None:
    """Arrivals at twice worker 0's rate: the queue grows through the window, so the window
    alone ties latency to worker 0's own load (a constant standing queue it cannot tell from
    slow service: that needs the unloaded latency, as above)."""
    est = poa_hat(standing_queue(seed, n, 0, workers, spacing=0.5))
    assert est.poa_routing >= 1.5, est.model


def decode_bound(seed: int, n: int, workers: int) -> list[WindowRequest]:
    """TTFT set by the whole cluster's decode load (a shared resource, say the interconnect or
    one prefill pool), times 10% jitter: whichever worker a request goes to, it gets the same
    TTFT. Each worker's own loads vary independently, and requests go anywhere."""
    rng = np.random.default_rng(seed)
    window = []
    for i in range(n):
        t = 0.05 * i
        d, q, u = (rng.integers(lo, hi, workers) for lo, hi in ((500, 4000), (0, 4000), (0, 512)))
        ttft = (0.03 + 2e-6 * float(d.sum())) * rng.lognormal(-0.005, 0.1)
        lines = {w: CandidateLoad(int(u[w]), int(q[w]), int(d[w])) for w in range(workers)}
        window.append(WindowRequest(f"r{i}", int(rng.integers(workers)), t, t + ttft, ttft, lines))
    return window


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(40, 200),
    workers=st.integers(2, 6),
    anchored=st.booleans(),
)
@settings(max_examples=25, deadline=None)
def test_when_every_policy_gives_the_same_ttft_routing_reads_about_one(
    seed, n, workers, anchored
) -> None:
    window = decode_bound(seed, n, workers)
    est = poa_hat(window, unloaded_latency_s=0.03 if anchored else None)
    assert est.poa_routing <= 1.1, est.model


# -- property 5: the router's own features, one estimator everywhere ---------------------------


def test_the_wire_path_gives_the_simulators_estimate() -> None:
    """The simulator's control loop feeds the estimator from the router's decisions; the same
    decisions as route and first_token events, through the wire codec and the joiner in a
    shuffled order (as the Ray actor and a Dynamo consumer get them), give the same window and
    the same estimate. The window request carries every candidate's line of the route event."""
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, TOPOLOGY, seed=5)
    load = ClosedLoop(cluster, template_source(profile, 5), [Phase(8.0, 96, ramp=1.0)])
    unloaded = unloaded_ttft(profile)
    sim_side = PoaEstimator(256, None, unloaded_latency_s=unloaded)
    ControlLoop(cluster, None, sim_side, until=load.end)
    cluster.loop.run(load.end)

    events = []
    for record in cluster.records:
        if record.first_token is not None and record.first_token <= load.end:
            events.append(
                RouteEvent.from_decision(
                    record.decision, record.routed, "", "", record.prefill_decision
                )
            )
            events.append(record.first_token_event())
    np.random.default_rng(0).shuffle(events)  # type: ignore[arg-type]
    joiner, wire_side = EventJoiner(ttl_s=1e9), PoaEstimator(256, None, unloaded_latency_s=unloaded)
    for event in events:
        received, _, _ = decode(event.kind, encode(event, "p", 1))
        add = joiner.add_route if isinstance(received, RouteEvent) else joiner.add_completion
        joined = add(received.to_record())  # type: ignore[arg-type]
        if joined is not None:
            wire_side.add(joined)
    assert [r.request_id for r in wire_side.window()] == [r.request_id for r in sim_side.window()]
    a, b = sim_side.estimate(), wire_side.estimate()
    assert (a.n, a.poa_hat, a.poa_routing, a.poa_capacity) == (
        b.n,
        b.poa_hat,
        b.poa_routing,
        b.poa_capacity,
    )
    # A request a prefill worker ran is placed by the prefill router's decision.
    request = sim_side.window()[-1]
    record = next(r for r in cluster.records if r.request_id == request.request_id)
    decision = record.prefill_decision
    assert decision is not None and request.worker == record.prefill_worker
    assert request.candidates == {
        w: CandidateLoad(u, a, d)
        for w, u, a, d in zip(
            decision.workers,
            decision.uncached_tokens,
            decision.active_prefill_tokens,
            decision.decode_blocks,
            strict=True,
        )
    }
