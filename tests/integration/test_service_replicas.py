"""``disaggctl serve`` with two ingress replicas (docs/design.md "Data flow (serve mode)").

The service runs as a subprocess with a Ray of its own (the harness of test_service_crash), so
its two Serve replicas do not meet the test session's Serve. Each replica routes in-process and
admits under its own lease; the auction actor and the ledger stay one. Checked:

1. below saturation, a burst from one user is answered FCFS (position 0, nothing charged), with
   no hold in the ledger: admitted by the replicas themselves;
2. with every request auctioned (``queue_threshold: 0``), concurrent bids from one user, spread
   by Serve over both replicas, never spend more than the user's budget: what the clients were
   told they paid is exactly what the ledger captured, no hold is left open, and the bids the
   budget could not cover got 402.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from pathlib import Path
from typing import Any

import openai
import pytest

from auction.ledger import Ledger
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
ingress_replicas: 2
auction:
  {{queue_threshold: {threshold}, max_in_prefill: {slots}, batch_size: 8, batch_window_ms: 20}}
"""


def _service(tmp_path: Path, threshold: int, slots: int, tag: str) -> tuple[ServeProcess, Path]:
    ledger = tmp_path / f"ledger-{tag}.sqlite"
    config = tmp_path / f"serve-{tag}.yaml"
    config.write_text(CONFIG.format(ledger=ledger, threshold=threshold, slots=slots))
    users = tmp_path / "users.yaml"
    users.write_text(
        "users:\n"
        f"  - {{name: alice, key_sha256: {hash_key(KEYS['alice'])}, budget: {BUDGET}}}\n"
        f"  - {{name: bob, key_sha256: {hash_key(KEYS['bob'])}, budget: 100.0}}\n"
    )
    return ServeProcess(tmp_path, config=config, users=users, tag=tag), ledger


async def _burst(url: str, user: str, bids: list[float]) -> list[dict[str, Any]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEYS[user], max_retries=0,
                                timeout=60.0)  # fmt: skip

    async def one(i: int, bid: float) -> dict[str, Any]:
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"replica test {i}"}],
                max_tokens=4, extra_body={"bid": bid},
            )  # fmt: skip
        except openai.APIStatusError as exc:
            return {"status": exc.status_code}
        body = raw.parse()
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


def test_below_saturation_both_replicas_admit_on_their_own(tmp_path: Path) -> None:
    # 64 slots: 32 leased to each replica, more than the burst can take from either.
    service, ledger_path = _service(tmp_path, threshold=64, slots=64, tag="fcfs")
    try:
        service.wait_serving()
        results = asyncio.run(_burst(service.url, "bob", [1.0] * 24))
        assert [r["status"] for r in results] == [200] * 24, results
        assert {(r["mode"], r["position"], r["payment"]) for r in results} == {("fcfs", 0, 0.0)}
    finally:
        _stop(service)
    with Ledger(ledger_path) as ledger:
        assert ledger.holds() == [], "FCFS under a lease writes nothing to the ledger"
        assert ledger.account("bob").spent == 0.0


def test_concurrent_bids_over_two_replicas_never_overspend(tmp_path: Path) -> None:
    service, ledger_path = _service(tmp_path, threshold=0, slots=4, tag="auction")
    bids = [0.5 + 0.01 * i for i in range(16)]  # Σ 8.6 > the budget of 2.5
    try:
        service.wait_serving()
        results = asyncio.run(_burst(service.url, "alice", bids))
        # Bob's requests compete in the same batches, so alice's VCG prices are not all zero.
        asyncio.run(_burst(service.url, "bob", [0.4] * 8))
    finally:
        _stop(service)
    statuses = sorted({r["status"] for r in results})
    assert set(statuses) <= {200, 402}, results
    answered = [r for r in results if r["status"] == 200]
    assert answered and all(r["mode"] == "auction" for r in answered), results
    told = round(sum(r["payment"] for r in answered), 6)
    with Ledger(ledger_path) as ledger:
        spent = ledger.account("alice").spent
        left_open = ledger.holds(state="open")
    assert spent <= BUDGET + 1e-9, f"alice spent {spent} of a budget of {BUDGET}"
    assert round(spent, 6) == told, f"the ledger captured {spent}, the clients were told {told}"
    assert not left_open, left_open
