"""Requests through Dynamo's own routers, from Python (docs/design.md §6 "Dynamo backend").

Over HTTP, Dynamo's frontend takes no per-request router settings; from Python it does
(DESIGN §6): ``KvRouter.best_worker(tokens, router_config_override)`` chooses a worker with the
controller's tau and omega for this request, and ``generate(..., worker_id=w)`` sends the request
there while keeping the router's load view. :class:`DynamoRoutes` holds one ``KvRouter`` per
pool and runs a request the way Dynamo's frontend runs a disaggregated one:

1. ``choose``: the prefill worker and the decode worker, each by its pool's ``KvRouter``;
2. ``prefill``: the prompt on the prefill worker with ``max_tokens = 1``; its last output carries
   the ``disaggregated_params`` (the KV handoff);
3. ``decode``: the request with ``prefill_result = {"disaggregated_params": ...}``, pinned to the
   decode worker (``routing.backend_instance_id``), streamed.

A worker that is gone (SIGKILLed, not yet out of discovery) fails its call at once; that surfaces
as :class:`DynamoWorkerFailed` naming the role and instance, and ``choose(..., exclude=...)`` then
picks among the others, so the ingress retries once elsewhere.

The runtime joins the deployment through the same environment the workers get
(``cluster.backends.dynamo.settings.dynamo_env``: file or etcd discovery, NATS event plane, TCP
request
plane).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from auction.priority import NON_PAYING
from cluster.backends.dynamo.discovery import Discovery, listen_host
from cluster.backends.dynamo.install import require_dynamo
from cluster.backends.dynamo.settings import DynamoSettings, dynamo_env
from cluster.serve.backend import WorkerFailed

__all__ = ["DynamoRoutes", "DynamoWorkerFailed"]

DISCOVERY_WAIT_S = 10.0
# Dynamo's scheduler answers "no endpoints available" whenever its worker set is empty at that
# instant, and a set being rebuilt can be (Dynamo's own frontend treats the error as transient).
# Seen once in a CI run, with both decode workers registered in etcd. A choice waits this long
# for the set to refill before the pool is reported empty.
NO_ENDPOINTS_GRACE_S = 2.0
NO_ENDPOINTS = "no endpoints available"


class DynamoWorkerFailed(WorkerFailed):
    """A Dynamo worker could not take or finish this request (``instance``: the one to exclude
    when the request is placed again; None: the pool as a whole)."""

    def __init__(self, role: str, instance: int | None, why: str) -> None:
        where = f"{role} pool" if instance is None else f"{role} instance {instance:x}"
        super().__init__(role, instance, why, where=where)
        self.instance = instance


class DynamoRoutes:
    """The two pools' ``KvRouter`` in this process; ``await start()`` before use."""

    def __init__(
        self, settings: DynamoSettings, *, nats_url: str, discovery: Discovery, model_name: str
    ) -> None:
        require_dynamo()
        self.settings = settings
        self.model_name = model_name
        self.discovery = discovery
        # Workers stream answers back to this process: on their hosts' reach (bind: node).
        self._env = dynamo_env(
            settings, nats_url=nats_url, discovery=discovery, system_port=None,
            host=listen_host(settings.bind),
        )  # fmt: skip
        # Any: Dynamo's DistributedRuntime and KvRouter (dynamo._core ships no type stubs).
        self.runtime: Any = None
        self.routers: dict[str, Any] = {}
        self._starting: asyncio.Lock | None = None

    async def start(self) -> DynamoRoutes:
        """Join the deployment on the running event loop (the one requests are served on:
        the runtime keeps the loop it was made on); idempotent."""
        if self.runtime is not None:
            return self
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self.runtime is None:
                self._start()
                await self._discovered(DISCOVERY_WAIT_S)
        return self

    async def _discovered(self, timeout_s: float) -> None:
        """A new router learns the workers from discovery in the background: wait (a bounded
        time) until each pool has one, so the first request is not refused for nothing."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        probe = list(range(1, 1 + self.settings.block_size))
        for role in self.routers:
            while not await self._known(role, probe):
                if asyncio.get_running_loop().time() > deadline:
                    return  # choose() then reports the empty pool clearly
                await asyncio.sleep(0.05)

    async def _known(self, role: str, probe: list[int]) -> bool:
        """Whether ``role``'s router can choose a worker now: the call a request makes (its
        potential loads can list workers before its endpoint client has them; measured: the
        first requests then met "no endpoints available"). Without a request id it reserves
        nothing."""
        try:
            await self.routers[role].best_worker(probe, {}, request_id=None)
        except Exception:
            return False
        return True

    def _start(self) -> None:
        os.environ.update(self._env)  # the runtime reads its transports from the environment
        from dynamo.llm import KvRouter, KvRouterConfig
        from dynamo.runtime import DistributedRuntime

        s = self.settings
        self.runtime = DistributedRuntime(asyncio.get_running_loop(), self.discovery.backend, "tcp")
        components = {"prefill": s.prefill_component, "decode": s.decode_component}
        for role, component in components.items():
            endpoint = self.runtime.endpoint(f"{s.namespace}.{component}.{s.endpoint}")
            # Decode workers publish no KV events in disaggregated mode: their router balances
            # load only (Dynamo's own frontend does the same).
            config = (
                KvRouterConfig() if role == "prefill" else KvRouterConfig(overlap_score_credit=0.0)
            )
            self.routers[role] = KvRouter(endpoint, s.block_size, config)

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.shutdown()
            self.runtime = None
            self.routers = {}

    # -- the three steps ---------------------------------------------------------------------

    async def workers(self, role: str, tokens: list[int]) -> list[int]:
        """The instances ``role``'s router knows now (ascending)."""
        loads = await self.routers[role].get_potential_loads(tokens)
        return sorted({int(row["worker_id"]) for row in loads})

    async def choose(
        self, role: str, tokens: list[int], override: Mapping[str, float],
        exclude: Iterable[int] = (), request_id: str | None = None,
    ) -> int:  # fmt: skip
        """Dynamo's choice for ``role`` under ``override``; with ``exclude``, the cheapest of
        the rest by Dynamo's own potential loads (its router takes no exclusion list).

        With ``request_id`` the choice is also reserved in Dynamo's load view until
        :meth:`release` (the engine call then tracks the request itself). A query without it
        reserves nothing, so concurrent requests chosen before their engine calls start would
        all see the same loads and herd onto one worker (measured: bench.dynamo)."""
        banned = set(exclude)
        router = self.routers[role]
        worker = await self._best_worker(role, tokens, override, request_id)
        if int(worker) not in banned:
            return int(worker)
        await self.release(role, request_id)  # reserved on an excluded worker
        loads = [
            row for row in await router.get_potential_loads(tokens)
            if int(row["worker_id"]) not in banned
        ]  # fmt: skip
        if not loads:
            raise DynamoWorkerFailed(role, int(worker), "every worker of the pool failed")
        best = min(
            loads,
            key=lambda r: (r["potential_prefill_tokens"], r["potential_decode_blocks"],
                           int(r["worker_id"])),
        )  # fmt: skip
        return int(best["worker_id"])

    async def _best_worker(
        self, role: str, tokens: list[int], override: Mapping[str, float],
        request_id: str | None,
    ) -> int:  # fmt: skip
        """``KvRouter.best_worker``, waiting out a transiently empty worker set (at most
        ``NO_ENDPOINTS_GRACE_S``); any other refusal is reported at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NO_ENDPOINTS_GRACE_S
        while True:
            try:
                worker, _, _ = await self.routers[role].best_worker(
                    tokens, dict(override), request_id=request_id
                )
                return int(worker)
            except Exception as exc:
                if NO_ENDPOINTS not in str(exc) or loop.time() >= deadline:
                    why = f"no worker to route to ({_why(exc)})"
                    raise DynamoWorkerFailed(role, None, why) from None
            await asyncio.sleep(0.05)

    async def release(self, role: str, request_id: str | None) -> None:
        """Drop ``choose``'s reservation of ``request_id`` in ``role``'s router (idempotent)."""
        if request_id is None or role not in self.routers:
            return
        with contextlib.suppress(Exception):  # "not found": released already, or never held
            await self.routers[role].free(request_id)

    def _request(
        self, tokens: list[int], instance: int, override: Mapping[str, float], priority: int,
        stop_conditions: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        """A preprocessed request for ``instance`` (``generate_from_request``), ``priority``
        negated into the routing hint (see ``decode``) and as the router queue's tier
        (``strict_priority``, unsigned, a higher tier first: paying requests 1, the rest 0),
        which orders Dynamo's router queue where it queues (``--router-queue-threshold``)."""
        return {
            "token_ids": tokens, "model": self.model_name, "stop_conditions": stop_conditions,
            "sampling_options": {}, "output_options": {}, "eos_token_ids": [],
            "annotations": [], "router_config_override": dict(override),
            "routing": {"backend_instance_id": instance, "priority": -priority,
                        "strict_priority": max(NON_PAYING - priority, 0)},
        }  # fmt: skip

    async def prefill(
        self, tokens: list[int], instance: int, override: Mapping[str, float],
        request_id: str | None = None, priority: int = 0,
    ) -> Any:  # fmt: skip
        """Run the prompt on prefill ``instance``; the KV handoff for the decode worker.
        ``priority`` as in ``decode``: the whole request (``KvRouter.generate`` takes no
        priority in 1.6.1) so the routing hints carry it."""
        params: Any = None
        request = self._request(tokens, instance, override, priority, {"max_tokens": 1})
        try:
            stream = await self.routers["prefill"].generate_from_request(request)
            await self.release("prefill", request_id)  # the engine call tracks it from here
            async for out in stream:
                if isinstance(out, dict) and out.get("disaggregated_params") is not None:
                    params = out["disaggregated_params"]
        except Exception as exc:
            raise DynamoWorkerFailed("prefill", instance, _why(exc)) from None
        finally:
            await self.release("prefill", request_id)
        if params is None:
            raise DynamoWorkerFailed("prefill", instance, "returned no disaggregated_params")
        return params

    async def decode(
        self, tokens: list[int], instance: int, params: Any, max_tokens: int,
        override: Mapping[str, float], request_id: str | None = None, priority: int = 0,
    ) -> AsyncIterator[list[int]]:  # fmt: skip
        """Stream the output token ids of the request on decode ``instance``. ``priority`` is
        ``auction.engine_priority``'s (lower first); Dynamo's routing hint counts the other way
        (dynamo.vllm hands vLLM ``-routing.priority``), so it is sent negated."""
        request = self._request(
            tokens, instance, override, priority, {"max_tokens": max_tokens, "ignore_eos": True}
        )
        request["prefill_result"] = {"disaggregated_params": params}
        try:
            stream = await self.routers["decode"].generate_from_request(request)
            await self.release("decode", request_id)  # the engine call tracks it from here
            async for out in stream:
                ids = out.get("token_ids") if isinstance(out, dict) else None
                if ids:
                    yield [int(t) for t in ids]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise DynamoWorkerFailed("decode", instance, _why(exc)) from None
        finally:
            await self.release("decode", request_id)


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]
