"""The request path over the actors (cluster/serve/path.py), in-process against stand-in actors:
admission, routing, prefill and transfer, the decode stream, one retry, 503s, and books that
always close — the auction's hold captured at the first token (the position it sold), released
for a request that never got one."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from ray.exceptions import ActorDiedError

from auction import PAYING, engine_priority
from auction.admission import Release
from cluster.actor_ref import ActorHandles
from cluster.backends.sim.backend import SimBackend
from cluster.backends.sim.path import make_actor_path
from cluster.backends.sim.token_streams import DecodeOrder, StreamHost
from cluster.dataplane.admission import AdmissionGate, Lease
from cluster.dataplane.exchange import ExchangeIn, ExchangeOut, Refused, Settled
from cluster.dataplane.replica import ReplicaRouter
from cluster.dataplane.routing import PoolRouting, Route
from cluster.events import CompleteEvent, FirstTokenEvent, RouteEvent
from cluster.serve.errors import as_api_error
from cluster.serve.path import ActorRequestPath, Workers
from cluster.serve.path_types import (
    Admitted,
    Finished,
    PathError,
    PathEvent,
    PathRequest,
    Routed,
    TokenChunk,
)
from cluster.serve.replica_metrics import ENGINE_METHODS
from cluster.sim.profile import load_profile

PROFILE = load_profile("b200-llama70b-fp8-tp4")


class Method:
    """``handle.method.remote(...)`` → an awaitable, recording every call."""

    def __init__(self, impl: Callable[..., Any]) -> None:
        self.impl, self.calls = impl, []  # type: list[tuple[Any, ...]]

    def remote(self, *args: Any) -> Any:
        self.calls.append(args)
        result = self.impl(*args)
        if isinstance(result, AsyncIterator):
            return result
        return _awaitable(result)


async def _awaitable(value: Any) -> Any:
    if isinstance(value, BaseException):
        raise value
    if isinstance(value, Awaitable):
        return await value
    return value


class Auction:
    """The auction actor's exchange, recording what each request went through: by default
    every bid is released at position 2 with price 0.5 and every settlement acknowledged."""

    def __init__(self, answer: Release | Refused | BaseException | None = None) -> None:
        self.answer = answer or Release("?", 2, 0.5, "b-0", "auction")
        self.messages: list[ExchangeIn] = []
        self.exchange = Method(self._exchange)
        self.metrics_text = Method(lambda: "# TYPE disagg_auction_welfare gauge\n"
                                   "disagg_auction_welfare 3.0\n")  # fmt: skip

    def _exchange(self, message: ExchangeIn) -> ExchangeOut | BaseException | None:
        if isinstance(self.answer, BaseException):
            return self.answer
        self.messages.append(message)
        released, refused = [], []
        for bid in message.bids:
            if isinstance(self.answer, Release):
                released.append(dataclasses.replace(self.answer, request_id=bid.request_id))
            elif isinstance(self.answer, Refused):
                refused.append(dataclasses.replace(self.answer, request_id=bid.request_id))
        settled = [Settled(s.request_id, s.payment if s.capture else 0.0)
                   for s in message.settlements]  # fmt: skip
        return ExchangeOut("i1", tuple(released), tuple(refused), tuple(settled))

    def sent(self, what: str) -> list[Any]:
        return [item for m in self.messages for item in getattr(m, what)]

    @property
    def settled(self) -> list[tuple[str, bool]]:
        return [(s.request_id, s.answered) for s in self.sent("settlements")]


class Holding(Auction):
    """An auction that never releases anything."""

    def __init__(self) -> None:
        super().__init__(Refused("?", 0, "", ""))

    def _exchange(self, message: ExchangeIn) -> ExchangeOut | BaseException | None:
        self.messages.append(message)
        return ExchangeOut("i1")


class Router(ReplicaRouter):
    """A replica's real router over decode workers 1 and 2 (and ``prefill`` when given, chosen
    for any uncached prompt), recording the path's calls; no NATS, no control plane."""

    def __init__(self, prefill: int | None = None) -> None:
        pools = PoolRouting(
            block_size=PROFILE.block_size, local_prefill_max_tokens=0,
            prefill_workers=() if prefill is None else (prefill,), decode_workers=(1, 2),
        )  # fmt: skip
        super().__init__(pools, Bus())  # type: ignore[arg-type]
        self.calls: dict[str, list[tuple[Any, ...]]] = {"route": [], "finish_prefill": [],
                                                        "complete": []}  # fmt: skip

    def route(self, request_id: str, tokens: Any, user: str, exclude: Any = ()) -> Route:
        self.calls["route"].append((request_id, list(exclude)))
        return super().route(request_id, tokens, user, exclude)

    def finish_prefill(self, request_id: str) -> None:
        self.calls["finish_prefill"].append((request_id,))
        super().finish_prefill(request_id)

    def complete(self, request_id: str) -> None:
        self.calls["complete"].append((request_id,))
        super().complete(request_id)


class Control:
    """The router actor, as the path sees it: metrics only."""

    def __init__(self) -> None:
        self.metrics_text = Method(lambda: "# TYPE disagg_routing_cost gauge\n"
                                   "disagg_routing_cost 1.5\n")  # fmt: skip


class Decode:
    """A decode worker's shared token streams over the real ``StreamHost``: every order streams
    its ``output_tokens`` tokens (ids 100, 101, ...); with ``die_after``, the actor dies once
    that many frames have left (each stream then fails where it stands)."""

    def __init__(self, die_after: int | None = None) -> None:
        self.die_after = die_after
        self.frames_sent = 0
        self.host = StreamHost(self._tokens, lambda order: None)
        self.submit = Method(self.host.submit)
        self.frames = Method(self._frames)
        self.metrics_text = Method(lambda: ActorDiedError())  # a dead actor: left out

    async def _tokens(self, order: DecodeOrder) -> AsyncIterator[int]:
        for i in range(order.output_tokens):
            await asyncio.sleep(0)
            yield 100 + i

    async def _frames(self, stream_id: str, interval_s: float) -> AsyncIterator[Any]:
        async with contextlib.aclosing(self.host.frames(stream_id, interval_s)) as frames:
            async for frame in frames:
                if self.die_after is not None and self.frames_sent >= self.die_after:
                    yield _awaitable(ActorDiedError())
                    return
                self.frames_sent += 1
                yield _awaitable(frame)


class Prefill:
    def __init__(self) -> None:
        self.prefill = Method(lambda *a: {"cached_tokens": 0})


class Bus:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.closed = False

    def start(self) -> None:
        pass

    def publish(self, event: Any) -> bool:
        self.events.append(event)
        return True

    async def close(self) -> None:
        self.closed = True


def _path(
    auction: Auction | None = None,
    router: Router | None = None,
    decode: dict[int, Any] | None = None,
    prefill: dict[int, Any] | None = None,
    bus: Bus | None = None,
    gate: AdmissionGate | None = None,
) -> ActorRequestPath:
    router = router or Router()
    workers = Workers(prefill or {}, {1: Decode(), 2: Decode()} if decode is None else decode)
    return ActorRequestPath(
        auction=auction or Auction(),
        backend=SimBackend(
            router=router,
            workers=workers,
            profile=PROFILE,
            speedup=1000.0,  # the KV transfer's sleep: microseconds
        ),
        replica=router.replica_id,
        workers=workers,
        bus=bus,  # type: ignore[arg-type]
        extra_metrics=(Control(),),
        gate=gate,
        exchange_period_s=0.001,
    )


REQ = PathRequest(request_id="r1", user="alice", bid=1.0, tokens=list(range(40)), max_tokens=3)


def _run(path: ActorRequestPath, req: PathRequest = REQ) -> list[PathEvent]:
    async def collect() -> list[PathEvent]:
        return [event async for event in path.run(req)]

    return asyncio.run(collect())


def test_a_request_is_admitted_routed_streamed_and_charged() -> None:
    auction, router, bus = Auction(), Router(), Bus()
    events = _run(_path(auction, router, bus=bus))
    kinds = [type(e) for e in events]
    assert kinds == [Admitted, Routed, TokenChunk, TokenChunk, TokenChunk, Finished]
    assert events[0] == Admitted(position=2, payment=0.5, batch_id="b-0", mode="auction")
    routed = events[1]
    assert isinstance(routed, Routed)
    # An empty index: nothing cached, the tie between 1 and 2 goes to the lower id.
    assert (routed.decode_worker, routed.prefill_worker, routed.cached_tokens) == (1, None, 0)
    assert (routed.policy_version, routed.regime) == (0, "below")
    assert [e.token_ids for e in events if isinstance(e, TokenChunk)] == [[100], [101], [102]]
    assert events[-1] == Finished(payment_charged=0.5)
    assert [b.request_id for b in auction.sent("bids")] == auction.sent("started") == ["r1"]
    assert auction.settled == [("r1", True)]  # answered: the payment is captured
    (settlement,) = auction.sent("settlements")
    assert (settlement.hold_id, settlement.batch_id, settlement.payment) == (
        f"r1@{router.replica_id}", "b-0", 0.5,
    )  # fmt: skip
    assert router.calls["complete"] == [("r1",)]
    assert router.routing.in_flight("decode") == 0  # the reservation went with the request
    (route,) = router.bus.events  # type: ignore[attr-defined]
    assert isinstance(route, RouteEvent) and route.worker_id == 1 and route.user == "alice"
    first, done = bus.events
    assert isinstance(first, FirstTokenEvent) and first.worker_id == 1
    assert isinstance(done, CompleteEvent) and done.cached_tokens == 0 and done.status == "ok"


def _gate(slots: int) -> AdmissionGate:
    gate = AdmissionGate()
    gate.grant(Lease("L1", "replica", slots, "below", True, {"alice": 5.0}))
    return gate


def test_below_saturation_a_leased_replica_admits_with_no_actor_call() -> None:
    auction, gate = Auction(), _gate(slots=1)
    path = _path(auction, gate=gate)
    events = _run(path)
    assert events[0] == Admitted(position=0, payment=0.0, batch_id=None, mode="fcfs")
    assert events[-1] == Finished(payment_charged=0.0)
    assert auction.messages == []
    # No control-plane call; the engine got the order in one submit to its shared stream.
    assert path.calls == {"submit": 1} and path.calls.keys() <= ENGINE_METHODS
    assert gate.in_flight == gate.in_prefill == 0 and gate.admitted == 1


def test_a_replica_over_its_share_asks_the_auction_and_gives_its_slots_back() -> None:
    auction, gate = Auction(), _gate(slots=0)
    events = _run(_path(auction, gate=gate))
    assert events[0] == Admitted(position=2, payment=0.5, batch_id="b-0", mode="auction")
    assert auction.messages[0].overflowed_lease == "L1"  # the actor revokes that lease's slots
    assert auction.settled == [("r1", True)]


def test_a_remote_prefill_runs_before_decode_and_is_reported() -> None:
    router, prefill = Router(prefill=0), Prefill()
    events = _run(_path(router=router, prefill={0: prefill}))
    ((rid, prompt, local, seq, priority),) = prefill.prefill.calls
    assert (rid, prompt) == ("r1", 40) and len(local) == len(seq) == 40 // PROFILE.block_size
    assert priority == engine_priority(REQ.bid) == PAYING  # alice bid: ahead of free traffic
    assert router.calls["finish_prefill"] == [("r1",)]
    routed = next(e for e in events if isinstance(e, Routed))
    assert routed.prefill_worker == 0
    assert router.routing.in_flight("prefill") == router.routing.in_flight("decode") == 0


def test_a_worker_that_dies_before_the_first_token_is_excluded_and_the_request_retried() -> None:
    router = Router()
    events = _run(_path(router=router, decode={1: Decode(die_after=0), 2: Decode()}))
    assert [call[1] for call in router.calls["route"]] == [[], [1]]
    routed = next(e for e in events if isinstance(e, Routed))
    assert routed.decode_worker == 2 and isinstance(events[-1], Finished)
    assert router.routing.retries == 1 and router.routing.in_flight("decode") == 0


def test_two_failures_are_a_503_and_nothing_is_charged() -> None:
    auction, router = Auction(), Router()
    dead = {1: Decode(die_after=0), 2: Decode(die_after=0)}
    with pytest.raises(PathError) as err:
        _run(_path(auction, router, decode=dead))
    assert err.value.status == 503
    assert auction.settled == [("r1", False)]  # the hold is released, not captured
    assert router.routing.in_flight("decode") == 0


def test_a_missing_prefill_worker_is_excluded_and_the_decode_worker_prefills() -> None:
    router = Router(prefill=7)
    events = _run(_path(router=router, prefill={}))
    assert [call[1] for call in router.calls["route"]] == [[], [7]]
    routed = next(e for e in events if isinstance(e, Routed))
    assert routed.prefill_worker is None and isinstance(events[-1], Finished)


def test_a_decode_worker_that_dies_mid_stream_is_a_503_and_the_position_is_still_paid() -> None:
    auction = Auction()
    with pytest.raises(PathError) as err:
        _run(_path(auction, decode={1: Decode(die_after=1), 2: Decode()}))
    assert err.value.status == 503 and "mid-stream" in err.value.message
    assert auction.settled == [("r1", True)]  # captured at the first token, before the failure


def test_an_auction_that_does_not_answer_is_a_503_after_the_give_up_time() -> None:
    path = _path(Auction(ActorDiedError()))
    path.link.give_up_s = 0.0
    with pytest.raises(PathError) as err:
        _run(path)
    assert err.value.status == 503 and "auction" in err.value.message


def test_the_auctions_refusals_reach_the_client_with_their_status() -> None:
    with pytest.raises(PathError) as err:
        _run(_path(Auction(Refused("?", 402, "budget_exceeded", "alice: over budget"))))
    assert (err.value.status, err.value.message) == (402, "alice: over budget")
    assert err.value.code == "budget_exceeded"  # as decided at the auction, to the edge
    api = as_api_error(err.value)
    assert (api.status, api.code, api.param) == (402, "budget_exceeded", "bid")


def test_a_client_that_leaves_after_its_first_token_pays_its_quoted_price() -> None:
    auction, router = Auction(), Router()
    path = _path(auction, router)
    seen: list[PathEvent] = []

    async def leave_after_first_token() -> None:
        stream = path.run(REQ)
        async for event in stream:
            seen.append(event)
            if isinstance(event, TokenChunk):
                break
        await stream.aclose()

    asyncio.run(leave_after_first_token())
    quoted = next(e for e in seen if isinstance(e, Admitted)).payment
    (settlement,) = auction.sent("settlements")
    assert settlement.capture and settlement.payment == quoted == 0.5  # the price it was told
    assert auction.sent("started") == ["r1"]  # and its prefill slot freed, in the same exchange
    assert router.calls["complete"] == [("r1",)]
    assert router.routing.in_flight("decode") == 0


def test_a_client_that_leaves_with_its_admission_in_hand_pays_nothing_and_holds_nothing() -> None:
    auction, router, gate = Auction(), Router(), _gate(slots=0)  # admitted by the auction
    path = _path(auction, router, gate=gate)

    async def leave_once_admitted() -> PathEvent:
        stream = path.run(REQ)
        admitted = await anext(stream)
        await stream.aclose()  # the ingress closes the path when the client goes
        await asyncio.sleep(0.02)  # the next exchange carries the release
        return admitted

    admitted = asyncio.run(leave_once_admitted())
    assert isinstance(admitted, Admitted) and admitted.payment == 0.5
    assert auction.settled == [("r1", False)]  # released: no first token, nothing due
    (settlement,) = auction.sent("settlements")
    assert not settlement.capture
    assert router.calls["route"] == [] and router.routing.in_flight("decode") == 0
    assert path.link.idle and gate.in_flight == 0


def test_a_client_that_leaves_while_queued_withdraws_from_the_auction() -> None:
    auction = Holding()
    path = _path(auction)

    async def leave() -> None:
        task = asyncio.create_task(anext(path.run(REQ)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.02)  # the next exchange carries the withdrawal

    asyncio.run(leave())
    assert [b.request_id for b in auction.sent("bids")] == auction.sent("withdrawn") == ["r1"]
    assert path.link.idle


def test_metrics_are_merged_from_the_actors_and_the_bus_closes() -> None:
    bus = Bus()
    path = _path(bus=bus)

    async def scrape() -> str:
        text = await path.metrics_text()
        await path.aclose()
        return text

    text = asyncio.run(scrape())
    assert "disagg_routing_cost 1.5" in text and "disagg_auction_welfare 3.0" in text
    assert bus.closed


def test_the_routing_cost_on_metrics_is_the_replicas_own_last_decision() -> None:
    router = Router()
    path = _path(router=router)
    _run(path)
    assert router.last_cost is not None
    text = asyncio.run(path.metrics_text())
    # The router actor (Control) says 1.5; the replica routed, so its cost wins the merge.
    assert f"disagg_routing_cost {router.last_cost!r}" in text
    assert "disagg_routing_cost 1.5" not in text


def test_make_actor_path_builds_from_handles_without_nats() -> None:
    handles = ActorHandles(auction=Auction(), prefill={0: Prefill()}, decode={1: Decode()})

    async def build() -> ActorRequestPath:
        path = await make_actor_path(
            handles=handles, profile=PROFILE.name, speedup=1.0, nats_url=None, namespace="t",
            block_size=PROFILE.block_size, local_prefill_max_tokens=64,
        )  # fmt: skip
        await path.aclose()
        return path

    path = asyncio.run(build())
    assert path.bus is not None and path.bus.bus is None  # no NATS: events go nowhere
    assert list(path.workers.decode) == [1]
    assert path.backend.router.routing.workers("prefill") == (0,)
    assert path.backend.router.routing.workers("decode") == (1,)
    assert path.backend.profile.name == PROFILE.name


def test_cancelling_outside_a_ray_session_does_not_start_one() -> None:
    import ray

    from cluster.ray.worker_handles import ray_cancel

    assert not ray.is_initialized()
    ray_cancel(object())
    assert not ray.is_initialized()  # Ray's API would have auto-initialised a local session


def test_a_wedged_prefill_fails_within_the_deadline_and_the_decode_worker_prefills() -> None:
    """[21] 3: a prefill worker whose call never returns (a wedged engine) costs the request
    ``prefill_timeout_s``, not forever: it is placed again without that worker."""
    wedged = Prefill()
    wedged.prefill = Method(lambda *a: asyncio.Event().wait())  # never set
    router = Router(prefill=0)
    workers = Workers({0: wedged}, {1: Decode(), 2: Decode()})
    backend = SimBackend(
        router=router, workers=workers, profile=PROFILE, speedup=1000.0, prefill_timeout_s=0.2
    )
    path = ActorRequestPath(
        auction=Auction(), backend=backend, replica=router.replica_id, workers=workers,
        bus=None, exchange_period_s=0.001,
    )  # fmt: skip
    events = _run(path)
    assert [call[1] for call in router.calls["route"]] == [[], [0]]  # placed again without 0
    routed = [e for e in events if isinstance(e, Routed)]
    assert routed[-1].prefill_worker is None and isinstance(events[-1], Finished)
    with pytest.raises(ValueError, match="prefill_timeout_s"):
        SimBackend(router=router, workers=workers, profile=PROFILE, speedup=1.0,
                   prefill_timeout_s=0.0)  # fmt: skip
