"""The service's ``/metrics``, on a port of its own (docs/design.md "Security model", §5).

The public API port serves the API only: a scraper is not a client, and a scrape must not fan
out to every actor from the request path. This actor serves ``GET /metrics`` on
``metrics_host:metrics_port`` (the Helm chart exposes that port to the ServiceMonitor only).

What a scrape returns, merged by ``cluster.ray.metrics_export.merge_metrics_texts`` (counters
and histograms summed, a gauge from its one owner):

- every ingress replica's own families (requests, TTFT, ITL, actor calls, its routing view):
  each replica *pushes* its text every ``push_period_s`` (:meth:`MetricsServerActor.push`);
  a replica silent for ``replica_ttl_s`` (dead, or scaled down) drops out;
- the control plane's and the workers' families, fetched at most once a second
  (``cluster.ray.scrape_cache.ScrapeCache``) whatever the number of scrapers. A worker
  that a re-split restarted under the other role is found again by its name.

Sizes are bounded: a pushed text of at most :data:`MAX_TEXT_BYTES`, at most
:data:`MAX_REPLICAS` replicas (the oldest silent one is dropped first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ray.exceptions import RayActorError

from cluster.actor_ref import ActorRef
from cluster.ray.metrics_export import merge_metrics_texts
from cluster.ray.named_actor import NamedActor
from cluster.ray.refs import ControlRef
from cluster.ray.scrape_cache import ScrapeCache
from cluster.ray.worker_handles import Workers, named_worker_resolver

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette

__all__ = [
    "MAX_REPLICAS",
    "MAX_TEXT_BYTES",
    "PUSH_PERIOD_S",
    "Listening",
    "MetricsServerActor",
    "actors_metrics_text",
]

log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 1 << 20  # one replica's families: a few KiB in practice
MAX_REPLICAS = 1_024
PUSH_PERIOD_S = 1.0  # a replica's push; a scrape sees its counts at most this old
REPLICA_TTL_S = 30.0  # a replica silent this long is gone (dead, or scaled down)
FETCH_TIMEOUT_S = 1.0  # an actor that does not answer a scrape's fetch in time is left out


@dataclass(frozen=True)
class _Pushed:
    text: str
    at: float  # monotonic


@dataclass(frozen=True)
class Listening:
    """Where the metrics server listens (``ready``): the address it bound and its port."""

    host: str
    port: int


class MetricsServerActor:
    """Ray actor (``ray.remote(MetricsServerActor)``): ``ready()`` binds the port."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        namespace: str,
        actors: dict[str, ActorRef | None],
        prefill: dict[int, ActorRef],
        decode: dict[int, ActorRef],
        replica_ttl_s: float = REPLICA_TTL_S,
        worker_ids: Collection[int] = (),
    ) -> None:
        self.host, self.port = host, port
        self.actors = [a for a in actors.values() if a is not None]
        self.workers = Workers(dict(prefill), dict(decode), named_worker_resolver(namespace))
        # A re-split moves ids between roles, never adds one. ``worker_ids`` without handles:
        # each is found by name on the first scrape (the service passes names, not handles).
        self.worker_ids = {*prefill, *decode, *worker_ids}
        self.replica_ttl_s = replica_ttl_s
        self.replicas: dict[str, _Pushed] = {}
        self.cache = ScrapeCache(self._fetch_actors)
        self.scrapes = 0
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def ready(self) -> Listening:
        """Find the named actors (off the event loop: ``ray.get_actor`` blocks on the GCS),
        bind ``host:port`` (0: any free port) and serve; where it listens."""
        named = [a for a in self.actors if isinstance(a, NamedActor)]
        for actor in named:
            with contextlib.suppress(ValueError):  # not there (yet): looked up at first use
                await asyncio.to_thread(actor.handle)
        if self._server is None:
            self._server, self._task, self.port = await _serve(self._app(), self.host, self.port)
        return Listening(self.host, self.port)

    async def shutdown(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._task, 5.0)
            self._server = None

    # -- in ----------------------------------------------------------------------------------

    async def push(self, replica: str, text: str) -> bool:
        """One replica's own families (its whole current text, not a delta); False if refused.
        A restarted server (Ray restarts it) binds its port again on the first push."""
        if self._server is None:
            with contextlib.suppress(OSError):  # the old process's port not yet free: retry
                await self.ready()
        if not isinstance(replica, str) or not 0 < len(replica) <= 256:
            return False
        if not isinstance(text, str) or len(text.encode()) > MAX_TEXT_BYTES:
            log.warning("refused a metrics push from %s: not text, or over %d bytes",
                        replica[:64], MAX_TEXT_BYTES)  # fmt: skip
            return False
        now = time.monotonic()
        self._expire(now)
        if replica not in self.replicas and len(self.replicas) >= MAX_REPLICAS:
            oldest = min(self.replicas, key=lambda r: self.replicas[r].at)
            del self.replicas[oldest]
        self.replicas[replica] = _Pushed(text, now)
        return True

    def _expire(self, now: float) -> None:
        for replica in [r for r, p in self.replicas.items() if now - p.at > self.replica_ttl_s]:
            del self.replicas[replica]

    # -- out ---------------------------------------------------------------------------------

    async def metrics_text(self) -> str:
        """What ``GET /metrics`` answers: the replicas' texts first (their gauges win), then
        the actors' (cached for a second)."""
        self.scrapes += 1
        self._expire(time.monotonic())
        replicas = [p.text for _, p in sorted(self.replicas.items())]
        return merge_metrics_texts([*replicas, await self.cache.text()])

    async def _fetch_actors(self) -> str:
        await self._find_workers()
        return await actors_metrics_text(self.actors, self.workers)

    async def _find_workers(self) -> None:
        """A worker id with no live handle: look it up by name under either role (a re-split
        restarts an id under the other role). Asks no actor, the controller included."""
        have = {worker for _, worker, _ in self.workers.handles()}
        for worker in sorted(self.worker_ids - have):
            for role in ("prefill", "decode"):
                if await self.workers.get(role, worker) is not None:
                    break

    def _app(self) -> Starlette:
        from prometheus_client import CONTENT_TYPE_LATEST
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        async def metrics(request: Request) -> Response:
            return Response(await self.metrics_text(), media_type=CONTENT_TYPE_LATEST)

        return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


async def actors_metrics_text(actors: list[ActorRef], workers: Workers | None) -> str:
    """The families of ``actors`` and of ``workers``' handles, merged; one that does not answer
    within ``FETCH_TIMEOUT_S`` is left out, and a worker whose actor died is forgotten (a
    re-split stopped it: the next fetch finds its successor by name)."""
    known = workers.handles() if workers is not None else []
    handles = [*actors, *(h for _, _, h in known)]
    done = await asyncio.gather(*(_fetch(h) for h in handles), return_exceptions=True)
    for (role, worker, handle), result in zip(known, done[len(actors) :], strict=True):
        if isinstance(result, RayActorError) and workers is not None:
            workers.forget(role, worker, handle)
    return merge_metrics_texts([t for t in done if isinstance(t, str)])


async def _fetch(handle: ActorRef) -> str:
    return await asyncio.wait_for(ControlRef(handle).metrics_text(), FETCH_TIMEOUT_S)


async def _serve(
    app: Starlette, host: str, port: int
) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    """uvicorn on a socket bound here: a port in use is an OSError that names it (uvicorn's own
    bind would ``sys.exit`` inside the actor's event loop)."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(f"the metrics server cannot listen on {host}:{port}: {exc}") from None
    sock.setblocking(False)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    return server, task, int(sock.getsockname()[1])
