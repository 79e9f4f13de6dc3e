"""The ingress as a Ray Serve deployment (docs/design.md "Serve runtime").

``IngressDeployment`` is :class:`OpenAIIngress` under ``serve.ingress()``, late-bound: Serve
constructs the class on the replica, then calls its ``__serve_build_asgi_app__``, which builds
the request path, loads the tokenizer and returns :func:`cluster.serve.app.build_app`'s FastAPI
app, the very object the replica serves. Importing this module starts nothing.

What the composer passes (everything travels to the replica by pickling, so only plain values
and picklable callables; actor handles pickle):

- ``path_factory``: a zero-argument callable, run once on the replica, returning the
  :class:`RequestPath` (or an awaitable of it, for a path that must connect to NATS first),
  e.g. ``functools.partial(make_path, auction=auction_handle, router=router_handle, ...)``.
  Optional extras on the returned object: ``own_metrics_text() -> str`` (the replica's own
  families beyond the edge's, pushed to the metrics server), ``async metrics_text() -> str``
  (the actors' families too, for an app that serves ``/metrics`` itself: no ``metrics_sink``)
  and ``async aclose()`` (run at replica shutdown: close NATS, …);
- ``model_name`` (the served name clients put in ``model``) and ``model_dir`` (a directory of
  ``cluster.model_dir.build_model_dir``; None for ``default_model_dir()``, built on the node);
- ``users``: ``Users.to_wire()`` of the users file (name, key hash, budget; never keys), or None
  for no file; ``allow_anonymous``; ``max_body_bytes``;
- ``metrics_sink``: the service's metrics server actor (``cluster.ray.metrics_server``): the
  replica pushes its families there every second and its API port serves no ``/metrics``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from fastapi import FastAPI
from ray import serve
from ray.serve import Application

from cluster.actor_ref import ActorRef
from cluster.model_dir import DEFAULT_CONTEXT_TOKENS, ChatTokenizer, default_model_dir
from cluster.models import ConfigError, validate_model
from cluster.ray.metrics_export import merge_metrics_texts
from cluster.ray.metrics_server import PUSH_PERIOD_S
from cluster.serve.app import body_limit, build_app
from cluster.serve.limits import Limiter, LimitSettings
from cluster.serve.path_types import RequestPath
from cluster.serve.users import Users

__all__ = ["MAX_ONGOING_REQUESTS", "IngressDeployment", "OpenAIIngress", "ingress_app"]

log = logging.getLogger(__name__)

# Requests wait in the auction, not in Serve's queue: a replica must accept far more concurrent
# requests than run at once, or Serve's back-pressure would reorder them before the auction does.
MAX_ONGOING_REQUESTS = 10_000

PathFactory = Callable[[], RequestPath | Awaitable[RequestPath]]


class OpenAIIngress:
    """The replica's state; its app comes from :meth:`__serve_build_asgi_app__`."""

    def __init__(
        self,
        path_factory: PathFactory,
        *,
        model_name: str,
        model_dir: str | None = None,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
        users: Sequence[Mapping[str, object]] | None = None,
        allow_anonymous: bool = True,
        max_body_bytes: int | None = None,
        metrics_sink: ActorRef | None = None,
        limits: Mapping[str, object] | None = None,
        max_ongoing_requests: int = MAX_ONGOING_REQUESTS,
    ) -> None:
        self._path_factory = path_factory
        # This replica's part of the service's limits (cluster/serve/limits.py), validated here.
        self._limiter = Limiter(
            validate_model(LimitSettings, limits or {}, "limits"), max_ongoing=max_ongoing_requests
        )
        self._metrics_sink = metrics_sink
        self._push_task: asyncio.Task[None] | None = None
        self._model_name = model_name
        self._model_dir = model_dir
        self._context_tokens = context_tokens
        # Validated here, in the constructor, so a bad users list fails the deployment at once.
        self._users = Users.from_wire(users, allow_anonymous=allow_anonymous)
        self._max_body_bytes = max_body_bytes
        self.path: RequestPath | None = None

    async def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve calls this once on the replica, after ``__init__``; the returned app serves."""
        made = self._path_factory()
        path: RequestPath = await made if inspect.isawaitable(made) else made
        self.path = path
        model_dir = Path(self._model_dir) if self._model_dir else None
        # Building or reading the tokenizer files is disk work: keep the replica's loop free.
        tokenizer = await asyncio.to_thread(
            lambda: ChatTokenizer.from_dir(model_dir or default_model_dir(self._context_tokens))
        )
        sink = self._metrics_sink
        app = build_app(
            path,
            self._users,
            tokenizer,
            model_name=self._model_name,
            max_body_bytes=self._max_body_bytes or body_limit(tokenizer.context_tokens),
            # With a metrics server the API port serves no /metrics: this replica pushes.
            metrics_text=None if sink is not None else getattr(path, "metrics_text", None),
            metrics_route=sink is None,
            on_shutdown=self._shutdown,
            limiter=self._limiter,
            body_timeout_s=self._limiter.settings.body_timeout_s,
        )
        if sink is not None:
            own = _own_metrics(app.state.edge.metrics.text, path)
            self._push_task = asyncio.get_running_loop().create_task(
                push_metrics(sink, _replica_id(), own), name="metrics-push"
            )
        return app

    async def _shutdown(self) -> None:
        if self._push_task is not None:
            self._push_task.cancel()
        close = getattr(self.path, "aclose", None)
        if close is not None:
            await close()


def _own_metrics(edge_text: Callable[[], str], path: RequestPath) -> Callable[[], str]:
    """This replica's own families: the edge's (requests, TTFT, ITL) and the path's."""
    path_text: Callable[[], str] | None = getattr(path, "own_metrics_text", None)

    def text() -> str:
        parts = [edge_text(), path_text() if path_text is not None else ""]
        return merge_metrics_texts([p for p in parts if p])

    return text


def _replica_id() -> str:
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # outside a Serve replica (tests): any id unique to this process
        return uuid.uuid4().hex


async def push_metrics(sink: ActorRef, replica: str, text: Callable[[], str],
                       period_s: float = PUSH_PERIOD_S) -> None:  # fmt: skip
    """Every ``period_s``, hand the metrics server this replica's whole text (not a delta: a
    lost push costs one period's freshness, never a count). Never raises but to stop."""
    while True:
        try:
            await sink.push.remote(replica, text())  # the metrics server's push
        except Exception:  # the server restarting: the next period tries again
            log.warning("metrics push failed", exc_info=True)
        await asyncio.sleep(period_s)


IngressDeployment = serve.deployment(
    name="disagg-ingress", max_ongoing_requests=MAX_ONGOING_REQUESTS
)(serve.ingress()(OpenAIIngress))


# What each ingress replica reserves in Ray (Serve's own default, stated so the service can size
# a local session and check a joined cluster for it).
INGRESS_REPLICA_CPUS = 1.0


def check_ingress_cpus(replicas: int, cluster_cpus: float) -> None:
    """A Ray without the CPUs the ingress replicas reserve would leave Serve waiting for them
    forever: refuse at start, naming the setting."""
    need = replicas * INGRESS_REPLICA_CPUS
    if cluster_cpus < need:
        raise ConfigError(
            f"ingress_replicas: {replicas} replicas reserve {need:g} CPUs in Ray "
            f"({INGRESS_REPLICA_CPUS:g} each), but the Ray cluster joined has {cluster_cpus:g}"
        )


def ingress_app(
    path_factory: PathFactory,
    *,
    model_name: str,
    model_dir: str | None = None,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    users: Users | None = None,
    max_body_bytes: int | None = None,
    num_replicas: int = 1,
    max_ongoing_requests: int = MAX_ONGOING_REQUESTS,
    metrics_sink: ActorRef | None = None,
    env_vars: dict[str, str] | None = None,
    limits: LimitSettings | None = None,
    resources: dict[str, float] | None = None,
) -> Application:
    """The bound ingress, ready for ``serve.run(app, route_prefix="/")``. With
    ``metrics_sink`` (a ``cluster.ray.metrics_server.MetricsServerActor``) every replica pushes
    its own metric families there and the API port serves no ``/metrics``. ``env_vars``: what
    the replicas' processes need that their Ray session does not pass on. ``limits``: the
    service's per-identity limits, of which each replica enforces its share. ``resources``:
    Ray custom resources each replica asks for (``ServeConfig.control_resource``)."""
    users = users if users is not None else Users()
    options = IngressDeployment.options(
        num_replicas=num_replicas, max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={
            "num_cpus": INGRESS_REPLICA_CPUS,
            **({"resources": resources} if resources else {}),
            **({"runtime_env": {"env_vars": env_vars}} if env_vars else {}),
        },
    )  # fmt: skip
    return options.bind(
        path_factory,
        model_name=model_name,
        model_dir=model_dir,
        context_tokens=context_tokens,
        users=users.to_wire(),
        allow_anonymous=users.allow_anonymous,
        max_body_bytes=max_body_bytes,
        metrics_sink=metrics_sink,
        max_ongoing_requests=max_ongoing_requests,
        limits=(limits or LimitSettings()).per_replica(num_replicas).model_dump(),
    )
