"""``disaggctl serve`` with four and with two ingress replicas (docs/design.md "Data flow
(serve mode)").

The service runs as a subprocess with a Ray of its own (the harness of test_service_crash), so
its Serve replicas do not meet the test session's Serve. Each replica routes in-process and
admits under its own lease; the auction actor and the ledger stay one. Checked:

1. four replicas, below saturation: a burst from one user is answered FCFS (position 0,
   nothing charged), with no hold in the ledger: admitted by the replicas themselves. While
   long requests run, the replicas' load views converge: each replica's
   ``disagg_ingress_view_requests`` counts every request in flight in the fleet, not only the
   quarter it routed itself;
2. two replicas, with every request auctioned (``queue_threshold: 0``): concurrent bids from
   one user, spread by Serve over both replicas, never spend more than the user's budget: what
   the clients were told they paid is exactly what the ledger captured, no hold is left open,
   and the bids the budget could not cover got 402;
3. a replica SIGKILLed mid-load loses no money and leaks no slot: the requests it carried fail,
   their holds are released when its lease expires, the next requests are all answered (with
   four release slots, they could not be if the dead replica's requests still held theirs), and
   the ledger captured exactly what the answered clients were told.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.ledger.sqlite import Ledger
from cluster.ray.metrics_server import PUSH_PERIOD_S
from cluster.serve.users import hash_key
from tests.integration.test_service_crash import ServeProcess, describe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "disagg-tiny"
KEYS = {"alice": "sk-replicas-alice-0123456789", "bob": "sk-replicas-bob-0123456789"}
BUDGET = 2.5  # alice's: fewer than her bids in one burst, so some must be refused
CONFIG = """\
profile: b200-llama70b-fp8-tp4
topology: 1P/2D
speedup: 4.0
namespace: replicas
ledger_path: {ledger}
allow_anonymous: false
ingress_replicas: {replicas}
max_ongoing_requests: {ongoing}
auction:
  {{queue_threshold: {threshold}, max_in_prefill: {slots}, batch_size: 8, batch_window_ms: 20}}
admission: {{lease_ttl_s: {ttl}, hold_grace_s: 0.0}}
"""
# No grace for the holds (admission.hold_grace_s): a dead replica's holds go with its lease,
# which this test waits out; the grace itself is tests/cluster/test_hold_expiry.py.
LEASE_TTL_S = 1.0
CUT_STREAMS = 12  # long requests in flight when a replica is killed


def _service(
    tmp_path: Path, threshold: int, slots: int, tag: str, replicas: int, ongoing: int = 2000
) -> tuple[ServeProcess, Path]:
    ledger = tmp_path / f"ledger-{tag}.sqlite"
    config = tmp_path / f"serve-{tag}.yaml"
    config.write_text(CONFIG.format(ledger=ledger, threshold=threshold, slots=slots,
                                    ttl=LEASE_TTL_S, replicas=replicas,
                                    ongoing=ongoing))  # fmt: skip
    users = tmp_path / "users.yaml"
    users.write_text(
        "users:\n"
        f"  - {{name: alice, key_sha256: {hash_key(KEYS['alice'])}, budget: {BUDGET}}}\n"
        f"  - {{name: bob, key_sha256: {hash_key(KEYS['bob'])}, budget: 100.0}}\n"
    )
    return ServeProcess(tmp_path, config=config, users=users, tag=tag), ledger


async def _burst(
    url: str, user: str, bids: list[float], max_tokens: int = 4,
    finished: list[float] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[user], max_retries=0,
                                timeout=60.0)  # fmt: skip

    async def one(i: int, bid: float) -> dict[str, Any]:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"replica test {i}"}],
                max_tokens=max_tokens, extra_body={"bid": bid},
            )  # fmt: skip
        except openai.APIStatusError as exc:
            return {"status": exc.status_code}
        except openai.APIConnectionError:  # its replica died under it
            return {"status": "cut"}
        body = raw.parse()
        if finished is not None:
            finished.append(time.monotonic())
        return {"status": 200, **(body.model_extra or {}).get("disagg", {})}

    try:
        return list(await asyncio.gather(*(one(i, b) for i, b in enumerate(bids))))
    finally:
        await client.close()


def _stop(service: ServeProcess) -> None:
    service.popen.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        service.popen.wait(timeout=45)
    left = service.clean()
    assert not left, f"left behind: {describe(left)}"


SETTLE_S = 1.5  # from the burst's launch until every request is routed and reported


def _views_during(
    url: str, metrics_url: str, n: int, max_tokens: int
) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Launch ``n`` long requests at once; scrape the metrics server meanwhile (every replica
    pushes its families there each ``PUSH_PERIOD_S``). Per replica: the decode requests in
    flight in its view, at every scrape taken while all ``n`` surely ran and the pushes showed
    it (from ``SETTLE_S`` plus one push period after the launch until shortly before the first
    answer came back), in time order."""
    samples: list[tuple[float, str, int]] = []
    finished: list[float] = []

    async def scrape(task: asyncio.Future[list[dict[str, Any]]]) -> None:
        async with httpx.AsyncClient(timeout=10.0) as client:
            while not task.done():
                text = (await client.get(metrics_url)).text
                at = time.monotonic()
                totals: dict[str, int] = {}
                for family in text_string_to_metric_families(text):
                    for s in family.samples:
                        if s.name == "disagg_ingress_view_requests" and \
                                s.labels["role"] == "decode":  # fmt: skip
                            replica = s.labels["replica"]
                            totals[replica] = totals.get(replica, 0) + int(s.value)
                samples.extend((at, replica, total) for replica, total in totals.items())
                await asyncio.sleep(0.05)

    async def run() -> list[dict[str, Any]]:
        task = asyncio.ensure_future(_burst(url, "bob", [1.0] * n, max_tokens, finished))
        await scrape(task)
        return await task

    launched = time.monotonic()
    results = asyncio.run(run())
    until = min(finished, default=launched) - 0.2
    views: dict[str, list[int]] = {}
    for at, replica, total in samples:
        if launched + SETTLE_S + PUSH_PERIOD_S <= at <= until:
            views.setdefault(replica, []).append(total)
    return results, views


def test_below_saturation_four_replicas_admit_on_their_own_and_their_views_converge(
    tmp_path: Path,
) -> None:
    # 64 slots: 16 leased to each replica, more than the burst can take from any.
    service, ledger_path = _service(tmp_path, threshold=64, slots=64, tag="fcfs", replicas=4)
    try:
        service.wait_serving()
        results = asyncio.run(_burst(service.url, "bob", [1.0] * 24))
        assert [r["status"] for r in results] == [200] * 24, results
        assert {(r["mode"], r["position"], r["payment"]) for r in results} == {("fcfs", 0, 0.0)}
        # 16 long requests at once (1500 tokens at speed-up 4: seconds of decode each), spread
        # by Serve over the replicas: each replica routes about four of them itself.
        streams, views = _views_during(service.url, service.metrics_url, 16, 1500)
        assert [r["status"] for r in streams] == [200] * 16, streams
        assert len(_replicas(service)) == 4
    finally:
        _stop(service)
    # While all 16 ran, every replica's view converged on all 16: its own and the other three's
    # reports (each scrape shows every replica's view as last pushed; a push that a loaded
    # machine delays can show an earlier, partial view first, never a later one).
    assert len(views) == 4, views
    assert all(totals[-1] == 16 and max(totals) == 16 for totals in views.values()), views
    with Ledger(ledger_path) as ledger:
        assert ledger.holds() == [], "FCFS under a lease writes nothing to the ledger"
        assert ledger.account("bob").spent == 0.0


def _replicas(service: ServeProcess) -> list[int]:
    return [p.pid for p in service.owned() if "ServeReplica" in p.cmdline
            and "disagg-ingress" in p.cmdline]  # fmt: skip


async def _burst_and_kill(url: str, pid: int) -> list[dict[str, Any]]:
    # Long streams (400 tokens at speed-up 4: about a second of decode each), so that the
    # replica dies with requests in flight.
    load = asyncio.ensure_future(_burst(url, "bob", [0.3] * CUT_STREAMS, max_tokens=400))
    await asyncio.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    return await load


def _answered_after_a_replica_died(url: str) -> list[dict[str, Any]]:
    """Bursts until Serve routes around the dead replica (its proxy learns it within
    seconds), then one more: every request of that one must be answered."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(r["status"] == 200 for r in asyncio.run(_burst(url, "bob", [0.3] * 4))):
            break
        time.sleep(1.0)
    return asyncio.run(_burst(url, "bob", [0.3] * 8))


def test_concurrent_bids_over_two_replicas_never_overspend_even_when_one_dies(
    tmp_path: Path,
) -> None:
    # Each replica takes at most half of the kill's 12 streams (Serve's proxy holds the rest
    # until one has room), so the replica killed is surely carrying some: left to Serve's
    # power-of-two choices, all 12 could land on the survivor and nothing would be cut.
    service, ledger_path = _service(tmp_path, threshold=0, slots=4, tag="auction", replicas=2,
                                    ongoing=CUT_STREAMS // 2)  # fmt: skip
    bids = [0.5 + 0.01 * i for i in range(16)]  # Σ 8.6 > the budget of 2.5
    try:
        service.wait_serving()
        results = asyncio.run(_burst(service.url, "alice", bids))
        # Bob's requests compete in the same batches, so alice's VCG prices are not all zero.
        bob = asyncio.run(_burst(service.url, "bob", [0.4] * 8))
        replicas = _replicas(service)
        assert len(replicas) == 2, replicas
        cut_burst = asyncio.run(_burst_and_kill(service.url, replicas[0]))
        # The premise: both replicas carry 6 of the 12 streams, so the kill cuts some.
        assert any(r["status"] != 200 for r in cut_burst), cut_burst
        bob += cut_burst
        time.sleep(2 * LEASE_TTL_S)  # the dead replica's lease expires
        after = _answered_after_a_replica_died(service.url)
        bob += after
    finally:
        _stop(service)
    assert [r["status"] for r in after] == [200] * 8, after
    assert {r["status"] for r in bob} <= {200, 500, 502, 503, "cut"}, bob
    statuses = sorted({r["status"] for r in results})
    assert set(statuses) <= {200, 402}, results
    answered = [r for r in results if r["status"] == 200]
    assert answered and all(r["mode"] == "auction" for r in answered), results
    told = round(sum(r["payment"] for r in answered), 6)
    with Ledger(ledger_path) as ledger:
        spent = ledger.account("alice").spent
        bob_spent = ledger.account("bob").spent
        left_open = ledger.holds(state="open")
    assert spent <= BUDGET + 1e-9, f"alice spent {spent} of a budget of {BUDGET}"
    assert round(spent, 6) == told, f"the ledger captured {spent}, the clients were told {told}"
    bob_told = round(sum(r["payment"] for r in bob if r["status"] == 200), 6)
    # A cut request paid nothing, unless it had its first token before the kill: its price
    # (at most its bid, 0.3) was captured then, whether or not the client saw the end.
    cut = sum(1 for r in bob if r["status"] != 200)
    assert bob_told - 1e-6 <= bob_spent <= bob_told + 0.3 * cut + 1e-6, (bob_spent, bob_told)
    assert not left_open, left_open
