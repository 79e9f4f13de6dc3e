"""A PostgreSQL ledger that stops answering, under a running ``disaggctl serve`` ([21] 2;
docs/design.md "Security model", §1 "Ledger").

Every request is auctioned (``queue_threshold: 0``), so each one reserves, captures or releases
in the ledger. The server's processes are frozen (SIGSTOP) for 30 s: the kernel still
acknowledges their sockets, so no TCP timeout fires and the ledger's one thread waits. Checked:
the requests sent meanwhile each end (503, or answered) within their deadline, never hang; once
the server resumes the service answers again; and the books are exact: what the clients were
told they paid is what the ledger captured, and no hold is left open."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import psutil
import pytest

from cluster.ledger.postgres import PostgresLedger
from cluster.serve.users import hash_key
from tests.integration.test_service_crash import ServeProcess
from tests.integration.test_service_replicas import KEYS, _burst, _stop
from tests.postgres_server import PostgresServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STALL_S = 30.0
LEASE_TTL_S = 1.0
CONFIG = """\
profile: b200-llama70b-fp8-tp4
topology: 1P/2D
speedup: 4.0
namespace: stall
ledger_url: {ledger_url}
ledger_schema: {ledger_schema}
allow_anonymous: false
auction: {{queue_threshold: 0, max_in_prefill: 4, batch_size: 8, batch_window_ms: 20}}
admission: {{lease_ttl_s: {ttl}, hold_grace_s: 0.0}}
"""


def _frozen(server: PostgresServer) -> list[psutil.Process]:
    """The server's processes: the postmaster and every backend it forked."""
    assert server._proc is not None
    main = psutil.Process(server._proc.pid)
    return [main, *main.children(recursive=True)]


def test_a_ledger_that_stops_answering_costs_503s_not_hangs_and_loses_no_money(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    schema = f"stall_{uuid.uuid4().hex[:12]}"
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG.format(ledger_url=postgres.url, ledger_schema=schema,
                                    ttl=LEASE_TTL_S))  # fmt: skip
    users = tmp_path / "users.yaml"
    users.write_text(f"users:\n  - {{name: bob, key_sha256: {hash_key(KEYS['bob'])}, "
                     "budget: 100.0}\n")  # fmt: skip
    service = ServeProcess(tmp_path, config=config, users=users, tag="stall")
    told: list[float] = []
    try:
        service.wait_serving()
        before = asyncio.run(_burst(service.url, "bob", [0.4] * 4))
        assert [r["status"] for r in before] == [200] * 4, before
        told += [r["payment"] for r in before]
        processes = _frozen(postgres)
        stopped_at = time.monotonic()
        for p in processes:
            p.suspend()
        try:
            during = [r["status"] for r in asyncio.run(_burst(service.url, "bob", [0.4] * 4))]
        finally:
            time.sleep(max(0.0, stopped_at + STALL_S - time.monotonic()))
            for p in processes:
                p.resume()
        # Each ended with an answer or a 503: a hang would be "cut" by the client's own 60 s
        # timeout (_burst), the bound on hanging here, not a timing claim.
        assert set(during) <= {200, 503}, during
        assert 503 in during, during  # the premise: it stalled
        deadline = time.monotonic() + 60.0
        while True:  # the ledger's thread finishes what waited, then the service answers again
            after = asyncio.run(_burst(service.url, "bob", [0.4] * 4))
            if all(r["status"] == 200 for r in after):
                break
            told += [r["payment"] for r in after if r["status"] == 200]
            assert time.monotonic() < deadline, after
            time.sleep(1.0)
        told += [r["payment"] for r in after]
        time.sleep(3 * LEASE_TTL_S)  # a hold whose request gave up goes with the lease
    finally:
        _stop(service)
    with PostgresLedger(postgres.url, schema=schema) as ledger:
        spent = ledger.account("bob").spent
        left_open = ledger.holds(state="open")
    assert round(spent, 6) == round(sum(told), 6), (spent, told)
    assert not left_open, left_open
