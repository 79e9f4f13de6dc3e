"""The ingress replicas' routing views (cluster/dataplane/): one P/D rule, exact own loads, the
other replicas' reports with a TTL, and the control plane's policy and pools, all in-process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from cluster.dataplane.engine_loads import EngineReporter
from cluster.dataplane.peers import PeerLoads, PeerReport
from cluster.dataplane.replica import ReplicaRouter, peer_report
from cluster.dataplane.routing import PoolRouting, RoutingView
from cluster.dataplane.settings import RoutingSettings
from cluster.events import EngineLoadEvent, LoadEvent, PoolsEvent, RegimeEvent, RouteEvent
from cluster.serve.replica_metrics import view_requests_text
from cluster.wire import decode, encode
from router import LoadView, Policy

BLOCK = 16
PROMPT = list(range(64))  # four blocks


class Bus:
    namespace = "t"

    def __init__(self) -> None:
        self.events: list[Any] = []

    def publish(self, event: Any) -> bool:
        self.events.append(event)
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _pools(prefill: tuple[int, ...] = (0,), decode: tuple[int, ...] = (1, 2)) -> PoolRouting:
    return PoolRouting(
        block_size=BLOCK, local_prefill_max_tokens=32, prefill_workers=prefill,
        decode_workers=decode,
    )  # fmt: skip


def _replica(name: str, clock: Clock, **kwargs: Any) -> ReplicaRouter:
    return ReplicaRouter(
        _pools(**kwargs),
        Bus(),
        replica_id=name,
        clock=clock,  # type: ignore[arg-type]
    )


def test_a_route_reserves_on_both_pools_and_complete_returns_everything() -> None:
    pools = _pools()
    route = pools.route("r1", PROMPT, "alice")
    assert route.prefill_worker == 0  # 64 uncached tokens > 32: a prefill worker is chosen
    assert route.decode_worker == 1 and route.uncached_tokens == 64 and route.cached_tokens == 0
    assert len(route.local_hashes) == len(route.seq_hashes) == 4
    assert pools.own_loads("decode")[1] == LoadView(64, 4, 1)
    assert pools.own_loads("prefill")[0] == LoadView(64, 4, 1)
    pools.finish_prefill("r1")
    assert pools.own_loads("decode")[1] == LoadView(0, 4, 1)
    assert pools.in_flight("prefill") == 0
    pools.complete("r1")
    pools.complete("r1")  # idempotent
    assert pools.own_loads("decode")[1] == LoadView(0, 0, 0)


def test_a_short_prompt_is_prefilled_on_the_decode_worker() -> None:
    route = _pools().route("r1", PROMPT[:20], "alice")
    assert route.prefill_worker is None and route.prefill_decision is None


def test_the_route_event_carries_both_routers_decisions() -> None:
    """The PoA window places a remotely prefilled request by the prefill router's decision
    (games/join.py): the replica's route event carries it beside the decode router's."""
    replica = _replica("a", Clock(), prefill=(0, 3))
    route = replica.route("r1", PROMPT, "alice")
    (event,) = replica.bus.events  # type: ignore[attr-defined]
    assert isinstance(event, RouteEvent) and event.worker_id == route.decode_worker
    assert event.prefill is not None and event.prefill.worker_id == route.prefill_worker
    assert {c.worker_id for c in event.prefill.candidates} == {0, 3}
    replica.route("r2", PROMPT[:20], "alice")
    assert replica.bus.events[-1].prefill is None  # type: ignore[attr-defined]


def test_excluded_workers_are_not_chosen_and_a_fully_excluded_pool_is_refused() -> None:
    pools = _pools()
    assert pools.route("r1", PROMPT, "a", exclude=[1]).decode_worker == 2
    assert pools.route("r2", PROMPT, "a", exclude=[0]).prefill_worker is None
    with pytest.raises(ValueError, match="every worker is excluded"):
        pools.route("r3", PROMPT, "a", exclude=[1, 2])
    assert pools.retries == 2 and pools.in_flight("decode") == 2


@pytest.mark.parametrize(
    ("request_id", "tokens", "user", "field"),
    [("", PROMPT, "a", "request_id"), ("r", [], "a", "tokens"), ("r", PROMPT, 7, "user")],
)
def test_bad_requests_name_the_field(request_id: Any, tokens: Any, user: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        _pools().route(request_id, tokens, user)


def test_set_workers_moves_a_worker_between_pools() -> None:
    pools = _pools()
    assert pools.set_workers([0, 2], [1])
    assert (pools.workers("prefill"), pools.workers("decode")) == ((0, 2), (1,))
    assert not pools.set_workers([0, 2], [1])
    with pytest.raises(ValueError, match="both pools"):
        pools.set_workers([1], [1])


def test_peer_loads_sum_replicas_and_expire_with_their_ttl() -> None:
    peers = PeerLoads()

    def report(name: str, requests: int, expires: float) -> PeerReport:
        view = LoadView(10 * requests, requests, requests)
        return PeerReport(name, {"decode": {1: view}}, requests, 0, {"decode": {1: requests}},
                          expires)  # fmt: skip

    peers.update(report("a", 2, 5.0))
    peers.update(report("b", 3, 9.0))
    assert peers.totals("decode") == {1: LoadView(50, 5, 5)}
    assert peers.counters()[0] == 5
    peers.update(report("a", 1, 6.0))  # a newer report replaces the older one
    assert peers.totals("decode") == {1: LoadView(40, 4, 4)}
    assert peers.expire(6.0) == ["a"]
    assert peers.totals("decode") == {1: LoadView(30, 3, 3)} and peers.replicas() == ("b",)


def test_two_replicas_see_each_others_load_through_their_reports() -> None:
    clock = Clock()
    a, b = _replica("a", clock), _replica("b", clock)
    for k in range(3):
        a.route(f"a{k}", [*PROMPT[:20], k], "u", exclude=[2])  # three, all on worker 1
    report = a.load_event()
    assert {w.worker_id: w.requests for w in report.decode} == {1: 3, 2: 0}
    assert (report.routed, report.retries) == (3, 3)
    # On the wire and back, as NATS carries it.
    wired, _, _ = decode("load", encode(report, "pub", 1))
    b.on_event(wired)
    b.refresh_loads()
    assert b.routing.routers["decode"].loads.view(1).active_requests == 3
    assert b.route("b0", PROMPT[:20], "u").decode_worker == 2  # the load steers it away
    # b's view: a's three from its report, its own one exactly; on /metrics as a gauge.
    assert b.view_requests()["decode"] == {1: 3, 2: 1}
    text = view_requests_text(b.replica_id, b.view_requests())
    assert 'disagg_ingress_view_requests{replica="b",role="decode",worker="1"} 3' in text
    a.on_event(a.load_event())  # a replica ignores its own report
    assert a.peers.replicas() == ()
    clock.now += report.ttl_s  # a stops reporting (dead): its load leaves b's view
    b.refresh_loads()
    assert b.routing.routers["decode"].loads.view(1).active_requests == 0
    assert b.routing.routers["decode"].loads.view(2).active_requests == 1  # b's own, exact


def test_a_report_is_published_on_change_or_as_a_heartbeat() -> None:
    clock = Clock()
    replica = _replica("a", clock)
    assert replica.report() and not replica.report()  # nothing changed since
    replica.route("r1", PROMPT, "u")
    assert replica.report()
    clock.now += replica.settings.report_ttl_s / 2
    assert replica.report()  # idle, but the others must keep it in their views
    assert replica.reports == 3 == len(replica.bus.events) - 1  # and one route event


def test_the_policy_follows_newer_regime_events_and_the_pools_follow_pools_events() -> None:
    replica = _replica("a", Clock())
    replica.on_event(RegimeEvent(t=1.0, regime="saturated", tau=0.8, omega=0.1,
                                 ttft_p99_smoothed_s=2.0, policy_version=3))  # fmt: skip
    policy = replica.routing.policy
    assert (policy.tau, policy.omega, policy.version) == (0.8, 0.1, 3)
    assert replica.route("r1", PROMPT, "u").regime == "saturated"
    replica.on_event(RegimeEvent(t=2.0, regime="below", tau=0.0, omega=1.0,
                                 ttft_p99_smoothed_s=0.1, policy_version=2))  # fmt: skip
    assert replica.routing.policy.version == 3  # an older policy never wins
    replica.on_event(PoolsEvent(t=3.0, prefill_workers=(0, 2), decode_workers=(1,),
                                action="warm"))  # fmt: skip
    assert replica.routing.workers("prefill") == (0, 2)


def test_a_replica_starts_from_the_control_planes_view_and_keeps_routing_without_it() -> None:
    view = RoutingView(Policy(0.5, 0.2, 7, "transition"), (0,), (1, 2, 3))

    class Control:
        def __init__(self) -> None:
            self.up = True

        class _View:
            def __init__(self, control: Any) -> None:
                self.control = control

            def remote(self) -> Any:
                async def answer() -> RoutingView:
                    if not self.control.up:
                        raise RuntimeError("the router actor is restarting")
                    return view

                return answer()

        @property
        def view(self) -> Any:
            return Control._View(self)

    control = Control()

    async def scenario() -> tuple[bool, bool]:
        replica = ReplicaRouter(_pools(), Bus(), control=control)  # type: ignore[arg-type]
        synced = await replica.sync_view()
        control.up = False
        again = await replica.sync_view()
        replica.route("r1", PROMPT, "u")
        return synced, again

    assert asyncio.run(scenario()) == (True, False)


def test_the_view_wins_over_the_policy_except_a_restarted_routers_version_zero() -> None:
    pools = _pools()
    pools.set_policy(Policy(0.8, 0.1, 5, "saturated"))
    pools.apply_view(RoutingView(Policy(0.0, 1.0, 0, "below"), (0,), (1, 2)))
    assert pools.policy.version == 5  # the router actor restarted: it knows no policy yet
    pools.apply_view(RoutingView(Policy(0.3, 0.5, 2, "transition"), (0,), (1, 2)))
    assert (pools.policy.version, pools.regime) == (2, "transition")  # a restarted controller


def test_load_events_are_bounded_and_consistent() -> None:
    with pytest.raises(ValidationError, match="more than once"):
        LoadEvent(replica="a", t=1.0, ttl_s=1.0, prefill=(), decode=(
            {"worker_id": 1, "prefill_tokens": 0, "decode_blocks": 0, "requests": 0},
            {"worker_id": 1, "prefill_tokens": 0, "decode_blocks": 0, "requests": 0},
        ), routed=0, retries=0)  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(ValidationError, match="ttl_s"):
        LoadEvent(replica="a", t=1.0, ttl_s=0.0, prefill=(), decode=(), routed=0, retries=0)
    event = LoadEvent(replica="a", t=1.0, ttl_s=2.0, prefill=(), decode=(), routed=0, retries=0)
    assert peer_report(event, 10.0).expires == 12.0


def test_routing_settings_keep_a_report_alive_past_one_lost_message() -> None:
    assert RoutingSettings().report_period_s <= 0.1
    with pytest.raises(ValidationError, match="twice report_period_s"):
        RoutingSettings(report_period_s=0.5, report_ttl_s=0.6)


def _engine(worker: int, role: str, requests: int, blocks: int = 0, tokens: int = 0,
            ttl_s: float = 1.0) -> EngineLoadEvent:  # fmt: skip
    return EngineLoadEvent(
        worker_id=worker,
        role=role,
        t=0.0,
        ttl_s=ttl_s,  # type: ignore[arg-type]
        prefill_tokens=tokens,
        decode_blocks=blocks,
        requests=requests,
    )


def test_the_engines_snapshots_keep_a_dead_replicas_requests_in_the_view() -> None:
    clock = Clock()
    a, b = _replica("a", clock), _replica("b", clock)
    for k in range(3):
        a.route(f"a{k}", [*PROMPT[:20], k], "u", exclude=[2])  # three on worker 1
    b.on_event(a.load_event())
    b.route("b0", PROMPT[:20], "u", exclude=[1])  # one of b's own on worker 2
    clock.now += 2.0  # a died: its report expired, but its three still run on worker 1
    b.refresh_loads()
    assert b.view_requests()["decode"] == {1: 0, 2: 1}
    # The engines say what they hold: worker 1 the three, worker 2 b's own one and nothing else.
    b.on_event(_engine(1, "decode", requests=3, blocks=6))
    b.on_event(_engine(2, "decode", requests=1, blocks=2))
    b.refresh_loads()
    assert b.view_requests()["decode"] == {1: 3, 2: 1}  # b's own is not counted twice
    assert b.routing.routers["decode"].loads.view(1).active_decode_blocks == 6
    # A snapshot never lowers what the reports say (it lags requests just routed) ...
    b.on_event(a.load_event())
    b.on_event(_engine(1, "decode", requests=0))
    b.refresh_loads()
    assert b.view_requests()["decode"][1] == 3
    # ... a snapshot of another role is not this pool's, and snapshots expire like reports.
    b.on_event(_engine(2, "prefill", requests=9))
    clock.now += 2.0
    b.on_event(_engine(1, "decode", requests=5, ttl_s=0.5))
    b.refresh_loads()
    assert b.view_requests()["decode"] == {1: 5, 2: 1}
    clock.now += 0.5
    b.refresh_loads()
    assert b.view_requests()["decode"] == {1: 0, 2: 1}


def test_an_engine_reports_on_change_or_as_a_heartbeat() -> None:
    clock, sent = Clock(), []
    load = [(0, 0, 0)]
    reporter = EngineReporter(3, "decode", lambda: load[0], sent.append, ttl_s=0.9, clock=clock)
    assert reporter.report() and not reporter.report()  # nothing changed since
    load[0] = (16, 4, 1)
    assert reporter.report()
    assert (sent[-1].worker_id, sent[-1].role, sent[-1].requests) == (3, "decode", 1)
    clock.now += 0.31  # past a third of the TTL: idle, but the views must keep it
    assert reporter.report() and reporter.reports == len(sent) == 3
    assert sent[-1].decode_blocks == 4 and sent[-1].ttl_s == 0.9


def test_a_million_invented_replica_names_leave_the_view_bounded() -> None:
    """[21] 7: `load` reports are keyed by the replica's name, which a publisher chooses. A
    million names cost MAX_PEERS reports; a real replica is back in the view at its next
    report."""
    import dataclasses
    import tracemalloc

    from cluster.dataplane.peers import MAX_PEERS

    clock = Clock()
    real, b = _replica("real", clock), _replica("b", clock)
    real.route("r0", PROMPT[:20], "u", exclude=[2])
    for i in range(2 * MAX_PEERS):  # through the replica's own handler, as the bus delivers
        b.on_event(real.load_event().model_copy(update={"replica": f"invented-{i}"}))
    assert len(b.peers) == MAX_PEERS
    report = peer_report(real.load_event(), clock())
    tracemalloc.start()  # traced over the first 100k (tracing is slow), then untraced
    for i in range(100_000):
        b.peers.update(dataclasses.replace(report, replica=f"more-{i}"))
        if i == 10_000:
            at_10k, _ = tracemalloc.get_traced_memory()
    at_100k, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert at_100k <= at_10k + (64 << 10), "memory grew after the map was full"
    for i in range(100_000, 1_000_000):
        b.peers.update(dataclasses.replace(report, replica=f"more-{i}"))
    assert len(b.peers) == MAX_PEERS
    b.on_event(real.load_event())
    assert "real" in b.peers.replicas() and len(b.peers) == MAX_PEERS
    b.refresh_loads()
    assert b.view_requests()["decode"][1] >= 1  # real's request, in b's view again


def test_an_engine_snapshot_for_a_worker_not_routed_to_is_ignored() -> None:
    clock = Clock()
    b = _replica("b", clock)
    for worker in range(1_000, 101_000):  # invented worker ids: none of this replica's pools
        b.on_event(_engine(worker, "decode", requests=9))
    assert len(b.engines) == 0
    b.on_event(_engine(1, "decode", requests=3))
    assert len(b.engines) == 1


def test_the_kv_index_stops_growing_at_its_bound() -> None:
    from router import KvIndex
    from router.events import Stored

    index = KvIndex(BLOCK, max_blocks_per_worker=8)
    index.add_worker(1)
    assert index.apply(Stored(worker=1, parent_hash=None, blocks=((1, 11), (2, 12), (3, 13))))
    assert index.apply(Stored(worker=1, parent_hash=3, blocks=tuple((h, h) for h in range(4, 9))))
    assert index.cached_blocks(1) == 8
    assert not index.apply(Stored(worker=1, parent_hash=8, blocks=((9, 19),)))
    assert index.dropped["over_capacity"] == 1 and index.cached_blocks(1) == 8
    pools = PoolRouting(block_size=BLOCK, local_prefill_max_tokens=32, decode_workers=(1,),
                        max_blocks_per_worker=8)  # fmt: skip
    assert pools.routers["decode"].index.max_blocks_per_worker == 8


def test_a_pools_event_outside_the_deployment_leaves_the_pools_unchanged() -> None:
    """[21] 6: only the controller may publish `pools` (the server refuses it to every other
    role); what a replica still checks is that the pools are its deployment's."""
    replica = _replica("a", Clock())
    before = (replica.routing.workers("prefill"), replica.routing.workers("decode"))
    for forged in (
        PoolsEvent(t=3.0, prefill_workers=(0,), decode_workers=(1, 2, 99), action="warm"),
        PoolsEvent(t=3.0, prefill_workers=(0, 1, 2), decode_workers=(), action="warm"),
    ):
        replica.on_event(forged)
        assert (replica.routing.workers("prefill"), replica.routing.workers("decode")) == before
    assert replica.refused_pools == 2
    replica.on_event(PoolsEvent(t=4.0, prefill_workers=(), decode_workers=(0, 1, 2),
                                action="warm"))  # fmt: skip
    assert replica.routing.workers("decode") == (0, 1, 2)  # a re-split's move: applied
