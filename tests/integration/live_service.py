"""One live ``cluster.service.Service`` for the ``test_service_*`` modules (session-scoped fixture
``live_service`` in conftest.py), and the small HTTP helpers they share.

The service is the real composition (docs/design.md "Serve runtime"): workers, router, auction,
PoA and controller actors under the session's Ray, and the Ray Serve OpenAI ingress on a free
port. It is small and fast so that the whole set stays lean on a 2-core machine: Llama-3.1-70B
FP8 (TP 4), 1P/2D, ``speedup`` 4 (requests take tens of milliseconds). NATS is *external* (a
``NatsServer`` this module owns, on a fixed port), so the reliability tests can stop it and start
a new one on the same port under the running service.

Users (a users file given to the Service, keys known only here):
- ``alice``/``bob``: bidders (the auction's prices);
- ``carol``: the bad-input user; nothing may ever be reserved or charged to her;
- ``load``: a large budget for the bursts and failure tests (bid 0).
``allow_anonymous`` is False in the config: every test sends a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cluster.config import ServeConfig
from cluster.nats_server import NatsServer, free_port
from cluster.ray.auction_settings import AuctionSettingsModel
from cluster.ray.controller_pools import ResplitSection
from cluster.ray.controller_settings import ControllerSettings
from cluster.serve.users import Users
from cluster.service import Service

PROFILE = "b200-llama70b-fp8-tp4"
TOPOLOGY = "1P/2D"
SPEEDUP = 4.0
NAMESPACE = "svctest"
MODEL = "disagg-tiny"
KEYS: dict[str, tuple[str, float]] = {
    "alice": ("sk-test-alice-0123456789", 50.0),
    "bob": ("sk-test-bob-0123456789", 50.0),
    "carol": ("sk-test-carol-0123456789", 5.0),
    "load": ("sk-test-load-0123456789", 1000.0),
}
HTTP_TIMEOUT_S = 30.0


def key(user: str) -> str:
    return KEYS[user][0]


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key(user)}"}


@dataclass
class LiveService:
    service: Service
    url: str
    nats: NatsServer
    nats_port: int
    ledger_path: Path
    metrics_url: str  # the metrics server's /metrics (its own port, not the API's)

    @property
    def handles(self) -> Any:
        return self.service.handles

    def restart_nats(self, outage_s: float) -> None:
        """An outage: SIGKILL the server, wait ``outage_s``, start a new one on the same port
        (blocking; call it in a thread from async code)."""
        self.nats.stop(kill=True)
        self.nats.close()
        time.sleep(outage_s)
        self.nats = NatsServer(port=self.nats_port).start()

    def close(self) -> None:
        try:
            self.service.stop()
        finally:
            self.nats.close()


def start_live_service(tmp: Path) -> LiveService:
    nats_port = free_port()
    nats = NatsServer(port=nats_port).start()
    ledger = tmp / "ledger.sqlite"
    config = ServeConfig(
        profile=PROFILE,
        topology=TOPOLOGY,
        speedup=SPEEDUP,
        namespace=NAMESPACE,
        nats_url=nats.url,
        ledger_path=str(ledger),
        allow_anonymous=False,
        metrics_port=0,  # any free port: service.metrics_url says which
        # The replica serves HTTP on its own port too (test_service_direct_ingress); every other
        # test goes through Serve's proxy, as before.
        direct_port=free_port(),
        # Auction mode (when the queue is long or the regime is not "below") waits this long
        # for a batch to fill: long enough that two concurrent requests share one batch.
        auction=AuctionSettingsModel(batch_window_ms=150.0),
        # The pools stay 1P/2D on their own: the bursts here saturate the service, and a worker
        # moved under another test would change what it measures. test_service_resplit moves
        # one explicitly (the controller actor's resplit_now) and moves it back.
        controller=ControllerSettings(resplit=ResplitSection(enabled=False)),
    )
    # As ``disaggctl serve --users FILE`` builds them (Users.load with its defaults).
    users = Users.from_keys(KEYS)
    service = Service(config, users=users)
    try:
        service.start(host="127.0.0.1", port=free_port())
        assert service.url is not None
        r = httpx.get(service.url + "/health", timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 200, f"the service is not at {service.url}: {r.status_code}"
    except BaseException:
        service.stop()
        nats.close()
        raise
    assert service.metrics_url is not None
    return LiveService(service, service.url, nats, nats_port, ledger, service.metrics_url)


# -- HTTP helpers --------------------------------------------------------------------------------


def chat_body(content: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }


@dataclass
class StreamResult:
    """One streamed request as the client saw it."""

    status: int
    chunks: int = 0
    text: str = ""
    done: bool = False  # saw data: [DONE]
    error: dict[str, Any] | None = None  # an SSE error event, or the JSON error body
    disagg: dict[str, Any] | None = None  # the last chunk's
    finish_reason: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and self.error is None and self.disagg is not None

    @property
    def unavailable(self) -> bool:
        """A clear 503: the HTTP status, or (mid-stream) an SSE error event saying so."""
        if self.status == 503:
            return True
        err = (self.error or {}).get("error", {})
        return self.status == 200 and err.get("type") == "service_unavailable"


async def stream_chat(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    user: str = "load",
    on_first_token: asyncio.Event | None = None,
    counter: list[int] | None = None,
) -> StreamResult:
    """POST a streaming chat completion and read it to its end (the caller bounds the time)."""
    body = {**body, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=auth(user)) as r:
        res = StreamResult(r.status_code, headers=dict(r.headers))
        if r.status_code != 200:
            raw = await r.aread()
            with contextlib.suppress(ValueError):
                res.error = json.loads(raw)
            return res
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                res.done = True
                continue
            obj = json.loads(data)
            if "error" in obj:
                res.error = obj
                continue
            res.chunks += 1
            for choice in obj.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if not res.text and counter is not None:
                        counter[0] += 1
                        if on_first_token is not None:
                            on_first_token.set()
                    res.text += piece
                if choice.get("finish_reason"):
                    res.finish_reason = choice["finish_reason"]
            if obj.get("disagg"):
                res.disagg = obj["disagg"]
        return res


def metric_values(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one family's samples in a Prometheus text (labels as written)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            rest = head[len(name) :]
            if rest and rest[0] not in "{":
                continue  # another family with this prefix
            out[rest] = float(value)
    return out


def until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """Poll ``predicate()`` until it returns a truthy value (returned); AssertionError naming
    ``what`` after ``timeout_s``. Exceptions from the predicate count as not yet."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # a restarting actor answers with an error for a while
            last = exc
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    t0 = time.monotonic()
    yield
    print(f"[{label}: {time.monotonic() - t0:.2f} s]")
