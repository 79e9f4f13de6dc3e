"""The request path on the Dynamo backend (docs/design.md "Serve runtime", §6 "Dynamo backend").

    admit (the replica's lease, or the auction's exchange) → choose (Dynamo's KvRouters, with
    the override of the policy this replica syncs) → follow (our router in shadow, in-process:
    our breakdown, the route event) → prefill → decode stream → finish

The same path as :class:`cluster.serve.path.ActorRequestPath` — the auction, the ledger, the
events and the books are its own — with the routing and the engines replaced by Dynamo's. A
worker that fails before the first token is excluded and the request is chosen once more (one
retry, then 503); one that fails mid-stream ends the stream with an error and no charge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from cluster.dataplane.admission import AdmissionGate
from cluster.dataplane.lease import LeaseKeeper
from cluster.dataplane.routing import ROLES, PoolRouting
from cluster.dynamo.routing import DynamoRoutes, DynamoWorkerFailed
from cluster.dynamo.settings import DynamoSettings
from cluster.dynamo.shadow import dynamo_override
from cluster.dynamo.shadow_view import ShadowRoute, ShadowView, agreement_text
from cluster.kv_wire import kv_subject
from cluster.ray.actor_support import ActorBus
from cluster.serve.path import (
    ActorRequestPath,
    actor_calls_text,
    complete_event,
    routing_cost_text,
)
from cluster.serve.path_types import PathError, PathEvent, PathRequest, Routed, TokenChunk
from cluster.serve.worker_handles import Workers, named_worker_resolver
from cluster.sim.profile import load_profile

__all__ = ["DynamoRequestPath", "make_dynamo_path"]

log = logging.getLogger(__name__)


class DynamoRequestPath(ActorRequestPath):
    """:class:`ActorRequestPath` whose routing and engines are Dynamo's."""

    def __init__(self, *, dynamo: DynamoRoutes, view: ShadowView, **kwargs: Any) -> None:
        super().__init__(replica=view.replica_id, **kwargs)
        self.dynamo = dynamo
        self.view = view  # the policy and our router in shadow (synced, never asked per request)
        self.overrides: dict[str, Any] = {}  # the last override sent, for tests and stats

    async def _serve(self, req: PathRequest, t0: float) -> AsyncIterator[PathEvent]:
        try:
            async for event in self._attempts(req, t0):
                yield event
        finally:
            # Whatever ended the request (a client gone mid-prefill included), no reservation
            # of it stays in Dynamo's load view. Local calls; idempotent.
            await asyncio.shield(self._release(req.request_id))

    async def _attempts(self, req: PathRequest, t0: float) -> AsyncIterator[PathEvent]:
        await self.dynamo.start()
        tokens = list(req.tokens)
        excluded: dict[str, list[int]] = {"prefill": [], "decode": []}
        for attempt in (0, 1):
            policy = self._policy()
            override: Mapping[str, float] = policy["override"]
            rid = req.request_id
            try:
                choose = self.dynamo.choose
                prefill_id = await choose("prefill", tokens, override, excluded["prefill"], rid)
                decode_id = await choose("decode", tokens, override, excluded["decode"], rid)
                self.overrides = {**override, "policy_version": policy["policy_version"]}
                route = self.view.follow(rid, tokens, req.user, prefill_id, decode_id)
            except BaseException as exc:
                await self._release(rid)  # no reservation outlives a request that never ran
                self.view.complete(rid)
                if isinstance(exc, DynamoWorkerFailed):
                    raise PathError(503, str(exc)) from None
                raise
            stream = self._generate(req, tokens, prefill_id, decode_id, override)
            try:
                first = await anext(stream)
            except DynamoWorkerFailed as exc:
                log.warning("request %s: %s", req.request_id, exc)
                await stream.aclose()
                await self._release(rid)
                self.view.complete(rid)
                if attempt == 1:
                    raise PathError(503, f"{exc}; failed on retry too") from None
                if exc.instance is not None:
                    excluded[exc.role].append(exc.instance)
                continue
            except StopAsyncIteration:
                raise PathError(503, f"decode instance {decode_id:x} produced no token") from None
            decode_slot, prefill_slot = route.decode_worker, route.prefill_worker
            yield Routed(
                decode_worker=decode_slot if decode_slot is not None else -1,
                prefill_worker=prefill_slot,
                policy_version=int(policy["policy_version"]),
                regime=str(policy["regime"]),
                cached_tokens=route.cached_tokens,
            )
            ttft = time.time() - t0
            if decode_slot is not None:
                self._first_token(req, decode_slot, prefill_slot, ttft)
            else:  # an instance just restarted, not yet bound: no events, the books still move
                self._started(req)
            yield first
            try:
                async for chunk in stream:
                    yield chunk
            except DynamoWorkerFailed as exc:
                raise PathError(503, f"{exc} mid-stream") from None
            if decode_slot is not None:
                self._publish_dynamo_complete(req, route, decode_slot, prefill_slot, ttft, t0)
            return

    def _publish_dynamo_complete(
        self, req: PathRequest, route: ShadowRoute, decode_id: int, prefill_id: int | None,
        ttft: float, t0: float,
    ) -> None:  # fmt: skip
        if self.bus is not None:
            self.bus.publish(complete_event(req, t0, ttft, decode_id, prefill_id,
                                            route.prompt_tokens, route.cached_tokens))  # fmt: skip

    async def _release_route(self, request_id: str) -> None:
        self.view.complete(request_id)

    def own_metrics_text(self) -> str:
        cost = self.view.last_cost
        text = actor_calls_text(self.calls) + ("" if cost is None else routing_cost_text(cost))
        return text + agreement_text(self.view.agreement)

    def _policy(self) -> dict[str, Any]:
        """The controller's policy as this replica's view has it (regime events and the shadow
        router's view, synced off the request path), in Dynamo's override fields."""
        policy = self.view.routing.policy
        return {
            "override": dynamo_override(policy.tau, policy.omega),
            "policy_version": policy.version,
            "regime": self.view.routing.regime,
        }

    async def _release(self, request_id: str) -> None:
        await self.dynamo.release("prefill", request_id)
        await self.dynamo.release("decode", request_id)

    def _started(self, req: PathRequest) -> None:
        if self.gate is not None and self.gate.is_local(req.request_id):
            self.gate.started(req.request_id)
        else:
            self.link.started(req.request_id)  # the next exchange tells the auction

    async def _generate(
        self, req: PathRequest, tokens: list[int], prefill_id: int, decode_id: int,
        override: Mapping[str, float],
    ) -> AsyncIterator[TokenChunk]:  # fmt: skip
        rid = req.request_id
        params = await self.dynamo.prefill(tokens, prefill_id, override, rid)
        self.view.finish_prefill(rid)
        decode = self.dynamo.decode(tokens, decode_id, params, req.max_tokens, override, rid)
        async for ids in decode:
            yield TokenChunk(token_ids=ids)

    async def aclose(self) -> None:
        if self.keeper is not None:
            await self.keeper.aclose()
        await self.link.aclose()
        await self.view.aclose()
        for task in list(self._background):
            task.cancel()
        if self.bus is not None:
            await self.bus.close()
        self.dynamo.close()


async def make_dynamo_path(
    *,
    handles: dict[str, Any],
    profile: str,
    nats_url: str,
    namespace: str,
    settings: dict[str, Any],
    discovery_dir: str,
    model_name: str,
    exchange_period_s: float = 0.1,
) -> DynamoRequestPath:
    """The path an ingress replica builds at start (picklable through ``functools.partial``);
    ``handles`` as :func:`cluster.serve.replica_path.make_actor_path` takes them, "router" being the
    shadow router."""
    bus = ActorBus(nats_url, namespace, name="ingress")
    dyn = DynamoSettings.model_validate(settings)
    # Every request of a disaggregated Dynamo deployment is prefilled on a prefill worker.
    pools = PoolRouting(
        block_size=dyn.block_size, local_prefill_max_tokens=0,
        prefill_workers=sorted(handles["prefill"]), decode_workers=sorted(handles["decode"]),
    )  # fmt: skip
    components = {"prefill": dyn.prefill_component, "decode": dyn.decode_component}
    view = ShadowView(
        pools, bus, control=handles["router"],
        kv_subjects={r: kv_subject(dyn.namespace, components[r]) for r in ROLES},
    )  # fmt: skip
    await view.start()  # the shadow router's view (policy, pools, instances) first; starts the bus
    gate = AdmissionGate()
    view.regime_listeners.append(gate.on_regime)
    keeper = LeaseKeeper(gate, handles["auction"], view.replica_id)
    await keeper.start()
    dynamo = DynamoRoutes(
        dyn, nats_url=nats_url,
        discovery_dir=discovery_dir, model_name=model_name,
    )  # fmt: skip
    # Joined on the first request, on the loop that serves requests (DynamoRoutes.start).
    path = DynamoRequestPath(
        dynamo=dynamo,
        view=view,
        auction=handles["auction"],
        router=handles["router"],
        workers=Workers(
            dict(handles["prefill"]), dict(handles["decode"]), named_worker_resolver(namespace)
        ),
        profile=load_profile(profile),
        speedup=1.0,
        bus=bus,
        extra_metrics=tuple(
            h for h in (handles.get("router"), handles.get("poa"), handles.get("controller")) if h
        ),
        gate=gate,
        exchange_period_s=exchange_period_s,
    )
    path.keeper = keeper
    return path
