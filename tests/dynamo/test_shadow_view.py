"""Our router in shadow inside a Dynamo ingress replica
(``cluster/backends/dynamo/shadow_view.py``),
in-process: the instance bindings synced from the shadow router actor's view, Dynamo's KV events
translated, every pick followed without an actor call, the agreement on ``/metrics``."""

from __future__ import annotations

import asyncio
from typing import Any

from cluster.actor_bus import ActorBus
from cluster.backends.dynamo.shadow_view import ShadowView, shadow_metrics_text
from cluster.dataplane.routing import PoolRouting
from cluster.events import RouteEvent
from cluster.ray.metrics_export import merge_metrics_texts
from tests.dynamo.test_shadow import BS, DEC_A, DEC_B, PREFILL, TOKENS, _shadow, _stored


class Handle:
    """The shadow router actor as a replica calls it (``view.remote()``)."""

    def __init__(self, actor: Any) -> None:
        self.view = type("M", (), {"remote": staticmethod(actor.view)})


def _view() -> tuple[ShadowView, list[RouteEvent]]:
    pools = PoolRouting(block_size=BS, local_prefill_max_tokens=0, prefill_workers=[0],
                        decode_workers=[1, 2])  # fmt: skip
    bus = ActorBus(None, "t", role="ingress", name="ingress")
    view = ShadowView(pools, bus, control=Handle(_shadow()))
    events: list[RouteEvent] = []
    view.bus.local.append(lambda subject, event: events.append(event))
    assert asyncio.run(view.sync_view())  # policy, pools and the instances, as a replica starts
    return view, events


def test_the_bindings_come_with_the_view_and_kv_events_are_translated() -> None:
    view, _ = _view()
    assert (view.slot("prefill", PREFILL), view.slot("decode", DEC_B)) == (0, 2)
    assert view.slot("decode", PREFILL) is None and view.slot("decode", None) is None
    assert view.feed_kv("prefill", _stored(PREFILL, TOKENS))
    assert not view.feed_kv("prefill", _stored(12345, TOKENS))  # no slot holds that instance
    assert view.unbound["kv"] == 1
    assert view.routing.routers["prefill"].index.overlap(TOKENS) == {0: 10}
    view.bind("prefill", 0, PREFILL + 1)  # the process restarted: its cache died with it
    assert not any(view.routing.routers["prefill"].index.overlap(TOKENS).values())


def test_every_pick_is_followed_reserved_published_and_compared() -> None:
    view, events = _view()
    view.feed_kv("prefill", _stored(PREFILL, TOKENS))
    first = view.follow("r1", TOKENS, "alice", PREFILL, DEC_A)
    assert (first.decode_worker, first.prefill_worker) == (1, 0)
    assert first.cached_tokens == len(TOKENS)  # the prefill worker holds the whole prompt
    assert first.agree == {"decode": "same", "prefill": "same"}  # an empty pool: 1 wins ties
    # r1 now loads decode 1: our router would pick 2, so Dynamo picking 1 again differs.
    second = view.follow("r2", TOKENS, "alice", PREFILL, DEC_A)
    assert second.agree["decode"] == "different"
    assert view.routing.in_flight("decode") == 2  # reserved on Dynamo's picks, not ours
    asyncio.run(view.bus.flush())
    assert [e.worker_id for e in events] == [1, 1] and events[0].user == "alice"
    view.complete("r1")
    view.complete("r2")
    assert view.routing.in_flight("decode") == view.routing.in_flight("prefill") == 0
    unbound = view.follow("r3", TOKENS, "alice", None, 999)  # an instance not bound yet
    asyncio.run(view.bus.flush())
    assert unbound.decode_worker is None and view.unbound["route"] == 1 and len(events) == 2
    # r1 was a tie at our lowest cost, r2 a worse pick in our cost; one prefill worker: no gap.
    assert view.cost_gap["prefill"].total == 0.0 and view.cost_gap["prefill"].count == 2
    assert view.cost_gap["decode"].total > 0.0 and view.cost_gap["decode"].count == 2
    once = shadow_metrics_text(view.agreement, view.cost_gap)
    text = merge_metrics_texts([once] * 2)  # two replicas, summed
    assert 'disagg_dynamo_router_agreement_total{agree="different",role="decode"} 2.0' in text
    assert 'disagg_dynamo_router_agreement_total{agree="same",role="prefill"} 4.0' in text
    assert 'disagg_dynamo_router_cost_gap_count{role="decode"} 4.0' in text
    gap = 2 * view.cost_gap["decode"].total
    assert f'disagg_dynamo_router_cost_gap_sum{{role="decode"}} {gap!r}' in text
