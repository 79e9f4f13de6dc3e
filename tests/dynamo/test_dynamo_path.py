"""The Dynamo request path in-process (``cluster/backends/dynamo/backend.py``, ``routing.py``):
real mocker
pools (1P/2D), Dynamo's ``KvRouter`` in this process, our shadow router and a ledger-less auction
stand-in as local objects. A request streams through prefill and decode; a dead decode worker is
routed around; with every decode worker dead the request fails with a clear 503."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from auction.admission import Release
from cluster.actor_bus import ActorBus
from cluster.backends.dynamo.backend import DynamoBackend
from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.routing import DynamoRoutes, DynamoWorkerFailed
from cluster.backends.dynamo.settings import DynamoSettings
from cluster.backends.dynamo.shadow import ShadowRouterActor
from cluster.backends.dynamo.shadow_view import ShadowView
from cluster.backends.dynamo.worker_actor import DynamoWorkerActor
from cluster.dataplane.exchange import ExchangeIn, ExchangeOut, Settled
from cluster.dataplane.routing import PoolRouting
from cluster.events import RouteEvent
from cluster.ray.worker_handles import Workers
from cluster.serve.path import ActorRequestPath
from cluster.serve.path_types import Admitted, Finished, PathError, PathRequest, Routed, TokenChunk
from tests.dynamo.conftest import WorkerFactory

pytestmark = pytest.mark.integration

SETTINGS = DynamoSettings.model_validate({"num_gpu_blocks": 128, "max_restarts": 0})
MODEL = SETTINGS.model_name
_ids = itertools.count()


class Handle:
    """A local object called the way a Ray actor handle is: ``handle.method.remote(...)``."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        class _Remote:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                return method(*args, **kwargs)

        return _Remote


class Auction:
    """Releases everything at once (FCFS), charges nothing; records what the path told it."""

    def __init__(self) -> None:
        self.first_tokens: list[str] = []
        self.settled: list[tuple[str, bool]] = []

    async def exchange(self, message: ExchangeIn) -> ExchangeOut:
        self.first_tokens += message.started
        self.settled += [(s.request_id, s.answered) for s in message.settlements]
        return ExchangeOut(
            "fake",
            released=tuple(Release(b.request_id, 0, 0.0, None, "fcfs") for b in message.bids),
            settled=tuple(Settled(s.request_id, 0.0) for s in message.settlements),
        )


def _request(n_tokens: int = 96, max_tokens: int = 6) -> PathRequest:
    i = next(_ids)
    tokens = [1, *range(100 + 7 * i, 100 + 7 * i + n_tokens - 1)]
    return PathRequest(f"req-{i}", "alice", 1.0, tokens, max_tokens)


async def _collect(path: ActorRequestPath, req: PathRequest) -> list[Any]:
    """The request's events; then its background bookkeeping (router notes), settled."""
    try:
        return [event async for event in path.run(req)]
    finally:
        await path.settle()


def test_requests_stream_and_dead_workers_are_routed_around(
    dynamo_nats_url: str, discovery_dir: str, dynamo_worker: WorkerFactory
) -> None:
    def worker(role: str, slot: int) -> DynamoWorkerActor:
        return dynamo_worker(SETTINGS, role, slot)

    async def main() -> None:
        pool = {0: worker("prefill", 0), 1: worker("decode", 1), 2: worker("decode", 2)}
        infos = await asyncio.gather(*(w.start() for w in pool.values()))
        ids = {info.slot: info.instance_id for info in infos}
        shadow = ShadowRouterActor(
            prefill_workers=[0], decode_workers=[1, 2], block_size=SETTINGS.block_size,
            components={"prefill": "prefill", "decode": "backend"}, nats_url=None,
            instances={"prefill": {0: ids[0]}, "decode": {1: ids[1], 2: ids[2]}},
        )  # fmt: skip
        routes: list[RouteEvent] = []
        auction = Auction()
        view = ShadowView(
            PoolRouting(block_size=SETTINGS.block_size, local_prefill_max_tokens=0,
                        prefill_workers=[0], decode_workers=[1, 2]),
            ActorBus(None, "t", role="ingress", name="ingress"), control=Handle(shadow),
        )  # fmt: skip
        view.bus.local.append(lambda subject, event: routes.append(event))
        # The shadow router's policy and the instances' slots, as a replica starts.
        assert await view.sync_view()
        assert view.slot("decode", ids[1]) == 1 and view.slot("prefill", ids[0]) == 0
        backend = DynamoBackend(
            view=view, dynamo=DynamoRoutes(
                SETTINGS, nats_url=dynamo_nats_url, discovery=Discovery.folder(discovery_dir),
                model_name=MODEL,
            ),
        )  # fmt: skip
        path = ActorRequestPath(
            auction=Handle(auction), backend=backend, replica=view.replica_id,
            workers=Workers({}, {}, lambda role, wid: None), exchange_period_s=0.01,
        )  # fmt: skip
        try:
            events = await _collect(path, _request())
            kinds = [type(e) for e in events]
            assert kinds[0] is Admitted and kinds[1] is Routed and kinds[-1] is Finished
            tokens = [t for e in events if isinstance(e, TokenChunk) for t in e.token_ids]
            assert len(tokens) == 6
            routed = events[1]
            assert routed.prefill_worker == 0 and routed.decode_worker in (1, 2)
            await view.bus.flush()  # our breakdown, published by the replica that followed Dynamo
            assert routes[-1].worker_id == routed.decode_worker
            assert sum(view.agreement["decode"].values()) == 1
            assert backend.overrides["router_temperature"] == 0.0
            assert len(auction.first_tokens) == 1 and auction.settled[-1][1] is True
            # The choice was reserved in Dynamo's view (no herding) and released: nothing of
            # a finished request stays in either router's load view.
            for role in ("prefill", "decode"):
                loads = await backend.dynamo.routers[role].get_potential_loads([1, 2, 3])
                assert [row["active_requests"] for row in loads] == [0] * len(loads), loads

            # Two choices in a row, before either runs: the first is reserved, so the second
            # goes to the other worker (a query alone would have sent both to the same one).
            probe = _request().tokens
            first = await backend.dynamo.choose("decode", probe, {}, (), "probe-1")
            second = await backend.dynamo.choose("decode", probe, {}, (), "probe-2")
            assert {first, second} == {ids[1], ids[2]}
            for rid in ("probe-1", "probe-2"):
                await backend.dynamo.release("decode", rid)
            await backend.dynamo.release("decode", "probe-1")  # twice: harmless

            # One decode worker dead (not restarted: max_restarts 0): answered by the other.
            await pool[1].kill_engine()
            for _ in range(4):
                events = await _collect(path, _request())
                assert next(e for e in events if isinstance(e, Routed)).decode_worker == 2

            # Every decode worker dead: a clear 503 after one retry, nothing charged.
            await pool[2].kill_engine()
            req = _request()
            with pytest.raises(PathError) as failed:
                await _collect(path, req)
            assert failed.value.status == 503 and "decode" in str(failed.value)
            assert auction.settled[-1] == (req.request_id, False)
            assert req.request_id not in view.routing.routers["decode"].loads  # books closed

            # Dynamo has dropped both from its pool by now, or we exclude them: a clear refusal.
            with pytest.raises(DynamoWorkerFailed, match=r"decode pool: no worker|every worker"):
                await backend.dynamo.choose("decode", req.tokens, {}, exclude=[ids[1], ids[2]])
        finally:
            await path.aclose()
            await asyncio.gather(*(w.shutdown() for w in pool.values()))

    asyncio.run(asyncio.wait_for(main(), 180))
