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
  Optional extras on the returned object: ``async metrics_text() -> str`` (the actors' metric
  families, merged; /metrics appends it to the ingress's own) and ``async aclose()`` (run at
  replica shutdown: close NATS, …);
- ``model_name`` (the served name clients put in ``model``) and ``model_dir`` (a directory of
  ``cluster.model_dir.build_model_dir``; None for ``default_model_dir()``, built on the node);
- ``users``: ``Users.to_wire()`` of the users file (name, key hash, budget; never keys), or None
  for no file; ``allow_anonymous``; ``max_body_bytes``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application

from cluster.model_dir import ChatTokenizer, default_model_dir
from cluster.serve.app import MAX_BODY_BYTES, build_app
from cluster.serve.path_types import RequestPath
from cluster.serve.users import Users

__all__ = ["MAX_ONGOING_REQUESTS", "IngressDeployment", "OpenAIIngress", "ingress_app"]

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
        users: list[dict[str, Any]] | None = None,
        allow_anonymous: bool = True,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._path_factory = path_factory
        self._model_name = model_name
        self._model_dir = model_dir
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
            lambda: ChatTokenizer.from_dir(model_dir or default_model_dir()))
        return build_app(
            path, self._users, tokenizer, model_name=self._model_name,
            max_body_bytes=self._max_body_bytes,
            metrics_text=getattr(path, "metrics_text", None),
            on_shutdown=getattr(path, "aclose", None),
        )


IngressDeployment = serve.deployment(
    name="disagg-ingress", max_ongoing_requests=MAX_ONGOING_REQUESTS
)(serve.ingress()(OpenAIIngress))


# What each ingress replica reserves in Ray (Serve's own default, stated so the service can size
# a local session and check a joined cluster for it).
INGRESS_REPLICA_CPUS = 1.0


def ingress_app(
    path_factory: PathFactory,
    *,
    model_name: str,
    model_dir: str | None = None,
    users: Users | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    num_replicas: int = 1,
    max_ongoing_requests: int = MAX_ONGOING_REQUESTS,
) -> Application:
    """The bound ingress, ready for ``serve.run(app, route_prefix="/")``."""
    users = users if users is not None else Users()
    options = IngressDeployment.options(
        num_replicas=num_replicas, max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": INGRESS_REPLICA_CPUS},
    )  # fmt: skip
    return options.bind(
        path_factory, model_name=model_name, model_dir=model_dir, users=users.to_wire(),
        allow_anonymous=users.allow_anonymous, max_body_bytes=max_body_bytes,
    )
