"""The forged-first-token scenario against a running ``disaggctl serve`` ([15]; docs/design.md §5,
"Plausibility"): 400 ``first_token`` events claiming 60 s TTFTs, encoded as the ingress encodes
them and published with no credentials on the service's NATS, leave an idle service ``below``
(``disagg_regime`` 0, τ 0) and are counted as dropped; real requests after them are answered."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.events import FirstTokenEvent
from cluster.nats_server import NatsServer
from cluster.wire import encode
from tests.integration.test_service_crash import ServeProcess
from tests.integration.test_service_replicas import _burst, _stop

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEY = "sk-replicas-bob-0123456789"  # test_service_replicas' "bob", whose key _burst sends
CONFIG = """\
profile: b200-llama70b-fp8-tp4
topology: 0P/1D
speedup: 4.0
namespace: forged
nats_url: {nats_url}
ledger_path: {ledger}
allow_anonymous: false
controller: {{tick_s: 0.5, theta1_s: 1.0, theta2_s: 2.0, min_samples: 5}}
"""


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _implausible(url: str) -> dict[str, float]:
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in _samples(url).items()
        if name == "disagg_events_dropped_total" and dict(labels)["reason"].startswith("impl")
        and value
    }


async def _forge(nats_url: str, n: int) -> None:
    client = await nats.connect(nats_url)  # no credentials: any process that reaches NATS
    try:
        for i in range(n):
            event = FirstTokenEvent(request_id=f"forged-{uuid.uuid4().hex[:12]}", t=time.time(),
                                    worker_id=0, ttft_s=60.0)  # fmt: skip
            await client.publish("disagg.forged.first_token", encode(event, "forger", i + 1))
        await client.flush()
    finally:
        await client.close()


def test_forged_ttfts_leave_an_idle_service_below(tmp_path: Path) -> None:
    from cluster.serve.users import hash_key

    with NatsServer() as server:
        config = tmp_path / "serve.yaml"
        config.write_text(CONFIG.format(nats_url=server.url, ledger=tmp_path / "ledger.sqlite"))
        users = tmp_path / "users.yaml"
        users.write_text(f"users:\n  - {{name: bob, key_sha256: {hash_key(KEY)}, budget: 10.0}}\n")
        service = ServeProcess(tmp_path, config=config, users=users, tag="forged")
        try:
            service.wait_serving()
            asyncio.run(_forge(server.url, 400))
            deadline = time.monotonic() + 30.0
            while sum(_implausible(service.url).values()) < 400:  # unrouted: after the 2 s hold
                assert time.monotonic() < deadline, _implausible(service.url)
                time.sleep(0.5)
            time.sleep(1.5)  # three more controller ticks
            seen = _samples(service.url)
            assert seen[("disagg_regime", ())] == 0.0  # below
            assert seen[("disagg_router_temperature", ())] == 0.0
            # Each event is dropped once, for the first reason that rules it out: a 60 s TTFT from
            # a service up for less than a minute by its time, otherwise by its missing route.
            drops = _implausible(service.url)
            assert sum(drops.values()) == 400
            assert set(drops) <= {"implausible_time", "implausible_unrouted"}, drops
            answered = asyncio.run(_burst(service.url, "bob", [0.0] * 4))
            assert [r["status"] for r in answered] == [200] * 4, answered
        finally:
            _stop(service)
