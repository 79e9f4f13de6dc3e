"""The metrics server (cluster/ray/metrics_server.py) in-process: pushed replica texts and
the actors' texts merged on its own port, bounded, and a busy port refused by name."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cluster.ray.metrics_server import MAX_TEXT_BYTES, MetricsServerActor


def families_of(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


class _Remote:
    def __init__(self, text: str) -> None:
        self.text, self.calls = text, 0

    def remote(self) -> Any:
        self.calls += 1
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        future.set_result(self.text)
        return future


class _Actor:
    def __init__(self, text: str) -> None:
        self.metrics_text = _Remote(text)


def _text(requests: float, gauge: float | None = None) -> str:
    registry = CollectorRegistry()
    Counter("disagg_requests", "requests", ["status"], registry=registry).labels("ok").inc(requests)
    if gauge is not None:
        Gauge("disagg_regime", "regime", registry=registry).set(gauge)
    return generate_latest(registry).decode()


def _server(**actors: Any) -> MetricsServerActor:
    return MetricsServerActor(host="127.0.0.1", port=0, namespace="mst", actors=actors,
                              prefill={}, decode={})  # fmt: skip


def test_replicas_are_summed_and_the_actors_merged_on_the_servers_own_port() -> None:
    controller = _Actor(_text(0, gauge=2.0))

    async def main() -> tuple[str, str, int]:
        server = _server(controller=controller)
        where = await server.ready()
        try:
            assert await server.push("replica-a", _text(3))
            assert await server.push("replica-b", _text(4))
            async with httpx.AsyncClient() as client:
                url = f"http://127.0.0.1:{where.port}"
                first = (await client.get(f"{url}/metrics")).text
                second = (await client.get(f"{url}/metrics")).text
                missing = (await client.get(f"{url}/v1/models")).status_code
        finally:
            await server.shutdown()
        return first, second, missing

    first, second, missing = asyncio.run(main())
    samples = families_of(first)
    assert samples["disagg_requests_total"] == {(("status", "ok"),): 7.0}
    assert samples["disagg_regime"] == {(): 2.0}
    assert first == second and controller.metrics_text.calls == 1  # fetched once a second
    assert missing == 404  # the metrics port serves /metrics only


def test_a_silent_replica_drops_out_and_pushes_are_bounded() -> None:
    async def main() -> tuple[str, bool, bool]:
        server = MetricsServerActor(host="127.0.0.1", port=0, namespace="mst", actors={},
                                    prefill={}, decode={}, replica_ttl_s=0.05)  # fmt: skip
        await server.ready()
        try:
            await server.push("gone", _text(5))
            await asyncio.sleep(0.1)
            await server.push("here", _text(1))
            text = await server.metrics_text()
            too_big = await server.push("big", "#" * (MAX_TEXT_BYTES + 1))
            nameless = await server.push("", _text(1))
        finally:
            await server.shutdown()
        return text, too_big, nameless

    text, too_big, nameless = asyncio.run(main())
    assert families_of(text)["disagg_requests_total"] == {(("status", "ok"),): 1.0}
    assert not too_big and not nameless


def test_a_busy_port_is_refused_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        server = MetricsServerActor(host="127.0.0.1", port=port, namespace="mst", actors={},
                                    prefill={}, decode={})  # fmt: skip
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            asyncio.run(server.ready())
