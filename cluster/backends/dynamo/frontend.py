"""Dynamo's own OpenAI frontend (``python -m dynamo.frontend``) as a process this project owns.

It is the baseline "Dynamo's own frontend" that ``bench/dynamo.py`` compares the project's ingress
against: same workers, same discovery, Dynamo's KV router instead of ours. The frontend finds
workers through the service's discovery (cluster/backends/dynamo/discovery.py); it lists a model
under
``GET /v1/models`` only once a worker serving it has registered, so readiness means "the model
is listed", which needs workers up.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import TracebackType

import httpx

from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.install import require_dynamo
from cluster.backends.dynamo.process import DynamoProcess, DynamoStartError
from cluster.backends.dynamo.settings import DynamoSettings, dynamo_env, frontend_command
from cluster.nats_server import free_port

__all__ = ["DynamoFrontend"]


class DynamoFrontend:
    """``dynamo.frontend`` on a loopback port; a context manager that stops it on exit."""

    def __init__(
        self,
        settings: DynamoSettings,
        *,
        nats_url: str,
        discovery: Discovery,
        log_path: str | Path,
        http_port: int | None = None,
        router_mode: str = "kv",
    ) -> None:
        self.settings = settings
        self.http_port = http_port or free_port()
        argv = frontend_command(settings, self.http_port, router_mode)
        env = dynamo_env(settings, nats_url=nats_url, discovery=discovery, system_port=None)
        self.process = DynamoProcess(argv, env, log_path, None)

    @property
    def url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"http://127.0.0.1:{self.http_port}/v1"

    def start(self) -> DynamoFrontend:
        """Start the process (not waiting for the model: see :meth:`wait_ready`)."""
        require_dynamo()
        self.process.start()
        return self

    def _models_listed(self, body: object) -> bool:
        data = body.get("data") if isinstance(body, dict) else None
        names = {m.get("id") for m in data if isinstance(m, dict)} if isinstance(data, list) else ()
        return self.settings.model_name in names

    def _check_alive(self) -> None:
        if not self.process.alive:
            raise DynamoStartError(self.process.describe("exited before it was ready"))

    def _timed_out(self, timeout_s: float) -> DynamoStartError:
        self.process.kill()
        return DynamoStartError(
            self.process.describe(
                f"did not list model {self.settings.model_name!r} within {timeout_s} s"
            )
        )

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until ``GET /v1/models`` lists the model; :class:`DynamoStartError` otherwise."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                self._check_alive()
                try:
                    response = await client.get(f"{self.url}/models")
                    if response.status_code == 200 and self._models_listed(response.json()):
                        return
                except (httpx.HTTPError, ValueError):
                    pass
                if time.monotonic() >= deadline:
                    raise await asyncio.to_thread(self._timed_out, timeout_s)
                await asyncio.sleep(0.1)

    def wait_ready_sync(self, timeout_s: float) -> None:
        """:meth:`wait_ready` for callers without an event loop (benchmarks, scripts)."""
        asyncio.run(self.wait_ready(timeout_s))

    def stop(self, grace_s: float = 10.0) -> None:
        self.process.stop(grace_s)

    def __enter__(self) -> DynamoFrontend:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
