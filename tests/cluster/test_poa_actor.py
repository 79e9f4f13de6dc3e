"""The PoA actor in-process (no Ray) over a real embedded NATS server (docs/design.md §3, §5):
route + first_token events in, a windowed poa_hat out, nothing fatal."""

from __future__ import annotations

import asyncio
import math
import uuid

import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.bus import EventBus
from cluster.events import Candidate, CompleteEvent, FirstTokenEvent, RouteEvent
from cluster.nats_auth import connect_options
from cluster.ray.poa_actor import PoaActor
from telemetry import metrics
from tests.waiting import until


def route(i: int, worker: int) -> RouteEvent:
    # Two decode workers (2, 3); the chosen one has the prefix cached, the other not.
    candidates = tuple(
        Candidate(
            worker_id=w,
            overlap_blocks=4 if w == worker else 0,
            uncached_tokens=64 if w == worker else 512,
            active_prefill_tokens=64 * (i % 5),
            prefill_blocks=(64 * (i % 5) + (64 if w == worker else 512)) / 16,
            decode_blocks=8,
            cost=1.0,
            probability=1.0 if w == worker else 0.0,
        )
        for w in (2, 3)
    )
    return RouteEvent(
        request_id=f"r{i}",
        t=float(i),
        user="alice",
        worker_id=worker,
        candidates=candidates,
        tau=0.0,
        omega=1.0,
        regime="below",
        policy_version=1,
    )


def first_token(i: int, worker: int, ttft_s: float) -> FirstTokenEvent:
    return FirstTokenEvent(request_id=f"r{i}", t=float(i) + 0.5, worker_id=worker, ttft_s=ttft_s)


def complete(i: int, worker: int, status: str = "ok") -> CompleteEvent:
    return CompleteEvent(
        request_id=f"r{i}",
        t=float(i) + 1.0,
        worker_id=worker,
        prefill_worker_id=None,
        ttft_s=0.3,
        itl_s=0.01,
        e2e_s=1.0,
        prompt_tokens=576,
        cached_tokens=0,
        output_tokens=16,
        status=status,
    )


async def started(url: str, **kwargs: object) -> tuple[PoaActor, EventBus, str]:
    ns = f"t{uuid.uuid4().hex[:8]}"
    actor = PoaActor(namespace=ns, nats_url=url, **kwargs)  # type: ignore[arg-type]
    info = await actor.ready()
    assert info.nats and info.subscribed and info.pid > 0
    publisher = EventBus(url, ns, role="ingress", name="test")
    await publisher.connect()
    return actor, publisher, ns


def test_estimate_appears_after_events_and_matches_the_gauges(nats_url: str) -> None:
    async def main() -> None:
        # Ticks by hand (tick_s = 60): a background tick between two reads below would make
        # the comparison depend on the machine's timing.
        actor, pub, _ = await started(nats_url, tick_s=60.0, profile="h100-32b")
        try:
            empty = actor.tick()  # an empty window: no estimate, gauges "no data"
            assert (empty.poa_hat, empty.poa_routing, empty.poa_capacity) == (None,) * 3
            assert math.isnan(metrics.POA_HAT._value.get())
            n = 24
            for i in range(n):
                worker = 2 + i % 2
                await pub.publish(route(i, worker))
                await pub.publish(first_token(i, worker, 0.05 + 0.01 * i))
                await pub.publish(complete(i, worker))  # after the first token: not a second half
            await pub.flush()
            await until(lambda: actor.received["complete"] == n)
            actor.tick()
            snap = await actor.snapshot()
            assert snap.n == n
            # Each factor is >= 1 by construction (games/poa.py): nothing is flagged.
            for factor in ("poa_hat", "poa_routing", "poa_capacity"):
                value = getattr(snap, factor)
                assert value is not None and value >= 1.0, snap
            assert snap.poa_hat == pytest.approx(snap.poa_routing * snap.poa_capacity)
            assert snap.impossible == tuple(
                f
                for f in ("poa_hat", "poa_routing", "poa_capacity")
                if getattr(snap, f) < 1 - metrics.POA_TOLERANCE
            )
            assert snap.impossible == ()
            assert snap.attribution_rate == 1.0 and snap.workers == (2, 3)
            assert snap.joiner.get("duplicate_completion", 0) == 0
            assert snap.received == {"route": n, "first_token": n, "complete": n}
            assert metrics.POA_HAT._value.get() == pytest.approx(snap.poa_hat)
            text = await actor.metrics_text()
            names = {f.name for f in text_string_to_metric_families(text)}
            assert {"disagg_poa_hat", "disagg_poa_impossible", "disagg_events_dropped"} <= names
            assert "disagg_regime" not in names  # the controller's, not ours
        finally:
            await pub.close()
            await actor.shutdown()

    asyncio.run(main())


def test_complete_stands_in_for_a_lost_first_token_and_counts_failures(nats_url: str) -> None:
    async def main() -> None:
        actor, pub, _ = await started(nats_url, tick_s=60.0)  # ticks by hand; no profile
        try:
            await pub.publish(route(1, 2))
            await pub.publish(complete(1, 2))  # its first_token was lost: the complete joins
            await pub.publish(route(2, 3))
            await pub.publish(complete(2, 3, status="error"))  # failed before a token
            await pub.flush()
            await until(lambda: actor.received["complete"] == 2)
            snap = actor.tick()
            assert snap.n == 1 and snap.joiner["failed"] == 1
            assert snap.attribution_rate == 0.5 and snap.poa_hat is not None
        finally:
            await pub.close()
            await actor.shutdown()

    asyncio.run(main())


def test_malformed_messages_are_counted_not_fatal(nats_url: str) -> None:
    async def main() -> None:
        actor, pub, ns = await started(nats_url, tick_s=60.0)
        raw = await nats.connect(nats_url, **connect_options("ingress"))
        try:
            await raw.publish(f"disagg.{ns}.route", b"\xff not json")
            await raw.publish(f"disagg.{ns}.first_token", b'{"v": 1, "request_id": 7}')
            await raw.publish(f"disagg.{ns}.complete", b"[1, 2]")
            await raw.flush()
            await until(lambda: sum(actor._snapshot().dropped.values()) >= 3)
            # A valid event that the joiner cannot use (the worker is not among the candidates
            # of its route): counted, not raised.
            actor.on_event(first_token(9, 2, 0.1))
            actor.on_event(route(9, 3))
            actor.joiner.add_route = None  # type: ignore[assignment,method-assign]  # a bug
            actor.on_event(route(10, 2))
            assert actor.errors == 1
            # The subscription still delivers (a first token counts once its route is known).
            await pub.publish(route(11, 2))
            await pub.publish(first_token(11, 2, 0.1))
            await pub.flush()
            await until(lambda: actor.received["first_token"] == 2)
            snap = actor.tick()
            assert snap.dropped["malformed"] == 2 and snap.dropped["schema"] == 1
            assert snap.joiner["worker_mismatch"] == 1 and snap.n == 0
            assert snap.poa_hat is None
        finally:
            await raw.close()
            await pub.close()
            await actor.shutdown()

    asyncio.run(main())


def test_a_drain_empties_the_window_of_the_queues_requests() -> None:
    async def main() -> None:
        actor = PoaActor(nats_url=None, tick_s=60.0)  # ticks by hand
        await actor.ready()
        try:
            for i in range(4):  # routed before the drain; the last first token comes after it
                actor.on_event(route(i, 2))
            for i in range(3):
                actor.on_event(first_token(i, 2, 5.0))
            assert actor.tick().n == 3
            snap = await actor.forget_before(actor.now())
            assert snap.n == 0 and snap.poa_hat is None
            actor.on_event(first_token(3, 2, 5.0))  # the queue's last request: stays out
            actor.on_event(route(9, 3))  # routed after the drain
            actor.on_event(first_token(9, 3, 0.05))
            assert actor.tick().n == 1
            with pytest.raises(ValueError, match="since"):
                await actor.forget_before("soon")  # type: ignore[arg-type]
        finally:
            await actor.shutdown()

    asyncio.run(main())


def test_without_nats_and_bad_arguments() -> None:
    async def main() -> None:
        actor = PoaActor(nats_url=None, tick_s=0.05)
        info = await actor.ready()
        assert info.nats and not info.subscribed  # nothing to connect to: ready at once
        actor.on_event(route(1, 2))
        actor.on_event(first_token(1, 2, 0.2))
        await until(lambda: actor.ticks >= 2)  # the loop ticks by itself
        snap = await actor.snapshot()
        assert snap.n == 1 and snap.poa_hat is not None and snap.t is not None
        await actor.shutdown()

    asyncio.run(main())
    for bad in ({"tick_s": 0}, {"window_s": float("nan")}, {"speedup": -1.0}):
        with pytest.raises(ValueError):
            PoaActor(nats_url=None, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown hardware profile"):
        PoaActor(nats_url=None, profile="no-such-profile")
