"""Dynamo's engines as a :class:`~cluster.serve.backend.Backend` (docs/design.md "Serve runtime",
§6 "Dynamo backend"):

    place: choose (Dynamo's KvRouters, with the override of the policy this replica syncs) →
           follow (our router in shadow, in-process: our breakdown, the route event)
    stream: prefill on Dynamo's prefill worker → decode stream from Dynamo's decode worker,
            its tokens gathered into chunks (``stream_chunk_s``)

The request's lifecycle (admission, the one retry, events, money) is
``cluster/serve/path.py``'s, as for the simulated engines. A Dynamo worker that fails raises
``DynamoWorkerFailed`` (a ``WorkerFailed`` naming the instance to exclude).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

from auction import engine_priority
from cluster.actor_bus import ActorBus
from cluster.actor_ref import ActorHandles
from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.routing import DynamoRoutes
from cluster.backends.dynamo.settings import DynamoSettings
from cluster.backends.dynamo.shadow import dynamo_override
from cluster.backends.dynamo.shadow_view import ShadowView, shadow_metrics_text
from cluster.coalesce import coalesced
from cluster.dataplane.routing import ROLES, PoolRouting
from cluster.kv_wire import kv_subject
from cluster.serve.backend import Excluded, Placement
from cluster.serve.path import ActorRequestPath
from cluster.serve.path_types import PathRequest, TokenChunk
from cluster.serve.replica_metrics import routing_cost_text, view_requests_text
from cluster.serve.replica_path import compose_path

__all__ = ["DynamoBackend", "make_dynamo_path"]


class DynamoBackend:
    """Dynamo's routers and workers, followed by our router in shadow (``view``)."""

    def __init__(
        self, *, dynamo: DynamoRoutes, view: ShadowView, chunk_interval_s: float = 0.0
    ) -> None:
        self.dynamo = dynamo
        # Dynamo's workers answer one token per message; the replica gathers them (the same
        # stream_chunk_s as the simulated workers' frames; cluster/coalesce.py says why).
        self.chunk_interval_s = chunk_interval_s
        self.view = view  # the policy and our router in shadow (synced, never asked per request)
        self.overrides: dict[str, object] = {}  # the last override sent, for tests and stats
        self._placed: dict[str, tuple[list[int], int, int, Mapping[str, float]]] = {}

    async def start(self) -> None:
        await self.dynamo.start()

    async def place(self, req: PathRequest, excluded: Excluded) -> Placement:
        policy = self.view.routing.policy
        override = dynamo_override(policy.tau, policy.omega)
        rid, tokens = req.request_id, list(req.tokens)
        choose = self.dynamo.choose
        prefill_id = await choose("prefill", tokens, override, excluded.get("prefill", ()), rid)
        decode_id = await choose("decode", tokens, override, excluded.get("decode", ()), rid)
        self.overrides = {**override, "policy_version": policy.version}
        route = self.view.follow(rid, tokens, req.user, prefill_id, decode_id)
        self._placed[rid] = (tokens, prefill_id, decode_id, override)
        return Placement(route.decode_worker, route.prefill_worker, route.prompt_tokens,
                         route.cached_tokens, policy.version, route.regime)  # fmt: skip

    async def stream(self, req: PathRequest, placement: Placement) -> AsyncIterator[TokenChunk]:
        rid = req.request_id
        tokens, prefill_id, decode_id, override = self._placed[rid]
        priority = engine_priority(req.bid)
        params = await self.dynamo.prefill(tokens, prefill_id, override, rid, priority)
        self.view.finish_prefill(rid)
        decode = self.dynamo.decode(
            tokens, decode_id, params, req.max_tokens, override, rid, priority
        )
        async with contextlib.aclosing(coalesced(decode, self.chunk_interval_s)) as chunks:
            async for ids in chunks:
                yield TokenChunk(token_ids=ids)

    async def release(self, request_id: str) -> None:
        """No reservation of the request stays in Dynamo's load view or in ours. Local calls;
        idempotent."""
        self._placed.pop(request_id, None)
        await self.dynamo.release("prefill", request_id)
        await self.dynamo.release("decode", request_id)
        self.view.complete(request_id)

    def own_metrics_text(self) -> str:
        cost = self.view.last_cost
        text = "" if cost is None else routing_cost_text(cost)
        text += view_requests_text(self.view.replica_id, self.view.view_requests())
        return text + shadow_metrics_text(self.view.agreement, self.view.cost_gap)

    async def aclose(self) -> None:
        await self.view.aclose()
        self.dynamo.close()


async def make_dynamo_path(
    *,
    handles: ActorHandles,
    profile: str,
    nats_url: str,
    namespace: str,
    settings: Mapping[str, object],
    discovery: Discovery,
    model_name: str,
    exchange_period_s: float = 0.1,
    chunk_interval_s: float = 0.0,
) -> ActorRequestPath:
    """The path an ingress replica builds at start (picklable through ``functools.partial``);
    ``handles`` as :func:`cluster.backends.sim.path.make_actor_path` takes them, "router" being the
    shadow router."""
    del profile  # the engines are Dynamo's: no simulated profile on this path
    bus = ActorBus(nats_url, namespace, role="ingress", name="ingress")
    dyn = DynamoSettings.model_validate(settings)
    # Every request of a disaggregated Dynamo deployment is prefilled on a prefill worker.
    pools = PoolRouting(
        block_size=dyn.block_size, local_prefill_max_tokens=0,
        prefill_workers=sorted(handles.prefill), decode_workers=sorted(handles.decode),
    )  # fmt: skip
    components = {"prefill": dyn.prefill_component, "decode": dyn.decode_component}
    view = ShadowView(
        pools, bus, control=handles.router,
        kv_subjects={r: kv_subject(dyn.namespace, components[r]) for r in ROLES},
    )  # fmt: skip
    # Joined on the first request, on the loop that serves requests (DynamoRoutes.start).
    dynamo = DynamoRoutes(dyn, nats_url=nats_url, discovery=discovery, model_name=model_name)
    return await compose_path(
        handles=handles, namespace=namespace, bus=bus, view=view,
        backend=lambda _: DynamoBackend(dynamo=dynamo, view=view,
                                        chunk_interval_s=chunk_interval_s),
        exchange_period_s=exchange_period_s,
    )  # fmt: skip
