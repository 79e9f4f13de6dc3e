"""The forged-first-token scenario against a running ``disaggctl serve`` ([15]; docs/design.md §5,
"Plausibility", "Security model"). A client with no credentials is refused by the service's NATS.
With the ingress's own credentials (a compromised replica: the strongest forger that may publish
``first_token`` at all), 400 events claiming 60 s TTFTs leave an idle service ``below``
(``disagg_regime`` 0, τ 0) and are counted as dropped, and a forged ``regime`` is refused by the
server; real requests after them are answered. Then, past the service's first minute, 200
matched route/first-token pairs claiming 30 s TTFTs (routes and times all possible) are
dropped too: the engines' own snapshots say nothing was held ([21] 7)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.events import Candidate, FirstTokenEvent, RegimeEvent, RouteEvent
from cluster.ledger.postgres import PostgresLedger
from cluster.nats_auth import connect_options
from cluster.nats_server import NatsServer
from cluster.wire import encode
from tests.integration.test_service_crash import ServeProcess
from tests.integration.test_service_replicas import _burst, _stop
from tests.postgres_server import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEY = "sk-replicas-bob-0123456789"  # test_service_replicas' "bob", whose key _burst sends
CONFIG = """\
profile: b200-llama70b-fp8-tp4
topology: 0P/1D
speedup: 4.0
namespace: forged
nats_url: {nats_url}
ledger_url: {ledger_url}
ledger_schema: {ledger_schema}
allow_anonymous: false
controller: {{tick_s: 0.5, theta1_s: 1.0, theta2_s: 2.0, min_samples: 5}}
"""


def _samples(metrics_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(metrics_url, timeout=10.0).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _implausible(metrics_url: str) -> dict[str, float]:
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in _samples(metrics_url).items()
        if name == "disagg_events_dropped_total"
        and dict(labels)["reason"].startswith("impl")
        and value
    }


async def _refused_without_credentials(nats_url: str) -> str:
    with pytest.raises(nats.errors.Error) as refused:
        await nats.connect(nats_url, allow_reconnect=False, max_reconnect_attempts=0)
    return str(refused.value)


async def _forge_pairs(nats_url: str, n: int, ttft_s: float) -> None:
    """``n`` matched route and first-token pairs for worker 0, each as a request routed a moment
    ago whose first token took ``ttft_s``: what passes every check of routes and times."""
    client = await nats.connect(nats_url, **connect_options("ingress"))
    try:
        line = Candidate(worker_id=0, overlap_blocks=0, uncached_tokens=64,
                         active_prefill_tokens=0, prefill_blocks=1.0, decode_blocks=0,
                         cost=1.0, probability=1.0)  # fmt: skip
        for i in range(n):
            rid, now = f"pair-{uuid.uuid4().hex[:12]}", time.time()
            route = RouteEvent(request_id=rid, t=now - 0.05, user="bob", worker_id=0,
                               candidates=(line,), tau=0.0, omega=1.0, regime="below",
                               policy_version=0)  # fmt: skip
            first = FirstTokenEvent(request_id=rid, t=now, worker_id=0, ttft_s=ttft_s)
            await client.publish("disagg.forged.route", encode(route, "pairs", i + 1))
            await client.publish("disagg.forged.first_token", encode(first, "pairs", i + 1))
        await client.flush()
    finally:
        await client.close()


async def _forge(nats_url: str, n: int) -> list[str]:
    """Publish ``n`` forged first tokens and one forged saturated regime as the ingress;
    the errors the server sent back."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    client = await nats.connect(nats_url, error_cb=on_error, **connect_options("ingress"))
    try:
        for i in range(n):
            event = FirstTokenEvent(request_id=f"forged-{uuid.uuid4().hex[:12]}", t=time.time(),
                                    worker_id=0, ttft_s=60.0)  # fmt: skip
            await client.publish("disagg.forged.first_token", encode(event, "forger", i + 1))
        regime = RegimeEvent(t=time.time(), regime="saturated", tau=0.8, omega=0.1,
                             ttft_p99_smoothed_s=60.0, policy_version=99)  # fmt: skip
        await client.publish("disagg.forged.regime", encode(regime, "forger", 1))
        await client.flush()
        await asyncio.sleep(0.5)  # the server's -ERR for the regime comes back asynchronously
    finally:
        await client.close()
    return errors


def test_forged_ttfts_leave_an_idle_service_below(tmp_path: Path, postgres: PostgresServer) -> None:
    """Deployed as on a cluster: an external NATS with credentials and a PostgreSQL ledger
    (its password in PGPASSWORD, inherited by the service's Ray, where the auction opens it)."""
    from cluster.serve.users import hash_key

    schema = f"forged_{uuid.uuid4().hex[:12]}"
    with NatsServer() as server:
        config = tmp_path / "serve.yaml"
        config.write_text(
            CONFIG.format(nats_url=server.url, ledger_url=postgres.url, ledger_schema=schema)
        )
        users = tmp_path / "users.yaml"
        users.write_text(f"users:\n  - {{name: bob, key_sha256: {hash_key(KEY)}, budget: 10.0}}\n")
        launched = time.time()  # the service's epoch is later: its uptime is at most this
        service = ServeProcess(tmp_path, config=config, users=users, tag="forged")
        try:
            service.wait_serving()
            assert (
                "authorization violation"
                in asyncio.run(_refused_without_credentials(server.url)).lower()
            )
            errors = asyncio.run(_forge(server.url, 400))
            assert any("permissions violation for publish" in e and "regime" in e for e in errors)
            deadline = time.monotonic() + 30.0
            # Two consumers check each event, the controller and the PoA estimator; unrouted
            # ones are dropped after the 2 s hold.
            while sum(_implausible(service.metrics_url).values()) < 2 * 400:
                assert time.monotonic() < deadline, _implausible(service.metrics_url)
                time.sleep(0.5)
            time.sleep(1.5)  # three more controller ticks
            seen = _samples(service.metrics_url)
            assert seen[("disagg_regime", ())] == 0.0  # below
            assert seen[("disagg_router_temperature", ())] == 0.0
            # Each event is dropped once per consumer, for the first reason that rules it out:
            # a 60 s TTFT from a service up for less than a minute by its time, otherwise by its
            # missing route.
            drops = _implausible(service.metrics_url)
            assert sum(drops.values()) == 2 * 400
            assert set(drops) <= {"implausible_time", "implausible_unrouted"}, drops
            # Past the first minute a 30 s TTFT is no longer longer than the service has run,
            # and no request has reached the engine in the last 30 s (the real ones come after).
            time.sleep(max(0.0, launched + 60.0 - time.time()))
            before = _implausible(service.metrics_url)
            asyncio.run(_forge_pairs(server.url, 200, ttft_s=30.0))
            deadline = time.monotonic() + 30.0
            while _implausible(service.metrics_url).get("implausible_idle", 0) < 2 * 200:
                assert time.monotonic() < deadline, _implausible(service.metrics_url)
                time.sleep(0.5)
            time.sleep(1.5)  # three more controller ticks
            seen = _samples(service.metrics_url)
            assert seen[("disagg_regime", ())] == 0.0  # still below
            after = _implausible(service.metrics_url)
            assert after["implausible_idle"] == 2 * 200  # each pair, at each consumer, once
            assert {k: v for k, v in after.items() if k != "implausible_idle"} == before
            answered = asyncio.run(_burst(service.url, "bob", [0.0] * 4))
            assert [r["status"] for r in answered] == [200] * 4, answered
        finally:
            _stop(service)
    with PostgresLedger(postgres.url, schema=schema) as ledger:  # the auction's, on the server
        assert [(a.user, a.budget, a.spent) for a in ledger.accounts()] == [("bob", 10.0, 0.0)]
