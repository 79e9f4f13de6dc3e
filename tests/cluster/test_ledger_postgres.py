"""The PostgreSQL ledger's own edges, against a real server (tests/postgres_server.py): what its
schema refuses, schemas that are not ledgers, secrets kept out of URLs and messages, a server
that restarts or is not there. The ledger's contract itself (exactly once, holds, SIGKILL,
concurrent writers) runs on both backends in tests/cluster/test_ledger_{sqlite,holds}.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cluster.ledger import check_postgres_url, is_postgres_url, open_ledger
from cluster.ledger.postgres import PostgresLedger
from cluster.ledger.sqlite import Ledger, LedgerCorruptError, LedgerError
from cluster.nats_server import free_port
from tests.postgres_server import PostgresServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def schema() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def raw(postgres: PostgresServer, schema: str) -> Iterator[psycopg.Connection]:
    """A superuser's connection to the ledger's schema: someone who bypasses the ledger."""
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        yield conn


def test_the_schema_refuses_what_the_ledger_never_does(
    postgres: PostgresServer, schema: str, raw: psycopg.Connection
) -> None:
    with PostgresLedger(postgres.url, schema=schema) as ledger:
        ledger.open_account("alice", 5.0)
        ledger.charge("b0", "alice", 0.5)
        ledger.reserve("r1", "alice", 2.0, owner="replica-a", expires=1e12)
        ledger.reserve("r2", "alice", 2.0)
        ledger.capture("r1", "b1", 1.0)
    for forged, reason in (
        ("UPDATE journal SET amount = 0", "append-only"),
        ("DELETE FROM journal", "append-only"),
        ("TRUNCATE journal CASCADE", "append-only"),
        ("UPDATE holds SET state = 'open' WHERE hold_id = 'r1'", "only closes"),
        ("UPDATE holds SET amount = 1 WHERE hold_id = 'r2'", "only closes"),
        ("UPDATE holds SET owner = 'thief' WHERE hold_id = 'r2'", "only closes"),
        ("UPDATE holds SET expires = 1.0 WHERE hold_id = 'r1'", "only closes"),
        ("DELETE FROM holds", "never deleted"),
        ("TRUNCATE holds", "never deleted"),
        ("INSERT INTO holds (hold_id, \"user\", amount) VALUES ('r3', 'alice', 2000000)",
         "exceeds the remaining budget"),
        ("UPDATE accounts SET spent = 3500000", "exceeds the budget"),
        ("UPDATE accounts SET budget = 1000000", "check constraint"),  # below what was spent
    ):  # fmt: skip
        with pytest.raises(psycopg.Error, match=reason):
            raw.execute(forged)
    # A capture row for a hold that is still open, forged consistently with the balances.
    raw.execute(
        "INSERT INTO journal (batch_id, \"user\", hold_id, amount, balance_after) "
        "VALUES ('b1', 'alice', 'r2', 0, 3500000)"
    )
    with pytest.raises(LedgerCorruptError, match="captures a hold that is not captured"):
        PostgresLedger(postgres.url, schema=schema)


def test_a_schema_of_other_tables_is_not_a_ledger_and_is_left_as_it_was(
    postgres: PostgresServer, schema: str, raw: psycopg.Connection
) -> None:
    raw.execute(f"CREATE SCHEMA {schema}")
    raw.execute(f"CREATE TABLE {schema}.accounts (id INT)")
    with pytest.raises(LedgerCorruptError, match=f"schema {schema}.*not a ledger.*accounts"):
        PostgresLedger(postgres.url, schema=schema)
    tables = raw.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()
    assert tables == [("accounts",)]


def test_two_schemas_are_two_ledgers(postgres: PostgresServer, schema: str) -> None:
    with PostgresLedger(postgres.url, schema=schema) as a, PostgresLedger(
        postgres.url, schema=f"{schema}_b"
    ) as b:
        a.open_account("alice", 1.0)
        b.open_account("alice", 2.0)
        assert (a.balance("alice"), b.balance("alice")) == (1.0, 2.0)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://ledger:hunter2@db:5432/ledger",
        "postgres://ledger@db/ledger?password=hunter2",
        "postgresql://ledger:@db/ledger",
    ],
)
def test_a_url_with_a_password_is_refused_without_repeating_it(url: str) -> None:
    with pytest.raises(ValueError, match="PGPASSWORD") as info:
        PostgresLedger(url)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match="PGPASSWORD"):
        check_postgres_url(url)


@pytest.mark.parametrize(
    ("schema", "timeout"), [("Bad-Name", 1.0), ("x" * 64, 1.0), ("ok", 0.0), ("ok", float("nan"))]
)
def test_bad_schemas_and_timeouts_are_refused(schema: str, timeout: float) -> None:
    with pytest.raises(ValueError, match=r"schema|timeout"):
        PostgresLedger("postgresql://ledger@127.0.0.1/ledger", schema=schema, timeout=timeout)


def test_a_wrong_password_is_a_ledger_error_that_does_not_repeat_it(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", "not-the-password")
    with pytest.raises(LedgerError, match="password authentication failed") as info:
        PostgresLedger(postgres.url, timeout=5.0)
    assert postgres.url in str(info.value) and "not-the-password" not in str(info.value)


def test_no_server_is_a_ledger_error_naming_the_url() -> None:
    url = f"postgresql://ledger@127.0.0.1:{free_port()}/ledger"  # nothing listens there
    with pytest.raises(LedgerError, match=f"{url}.*(refused|connect)"):
        PostgresLedger(url, timeout=2.0)


def test_the_ledger_connects_again_after_the_server_restarts(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PostgresServer() as server:  # its own: a restart would cut the session's connections
        monkeypatch.setenv("PGPASSWORD", server.password)
        with PostgresLedger(server.url) as ledger:
            ledger.open_account("alice", 5.0)
            first = ledger.charge("b1", "alice", 1.0)
            server.restart()
            assert ledger.charge("b1", "alice", 1.0) == first  # a retry, after the restart
            assert ledger.charge("b2", "alice", 1.0).seq > first.seq
            server.stop()
            with pytest.raises(LedgerError, match=server.url):
                ledger.balance("alice")
            server.start()
            assert ledger.balance("alice") == 3.0


OPENER = r"""
import sys
from cluster.ledger import open_ledger
open_ledger(sys.argv[1], schema=sys.argv[2]).close()
print("opened", flush=True)
"""


def test_processes_opening_a_new_ledger_at_once_create_it_once(
    postgres: PostgresServer, schema: str
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, postgres.url, schema],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=env,
        )
        for _ in range(4)
    ]
    for opener in openers:
        out, _ = opener.communicate(timeout=120)
        assert opener.returncode == 0 and out.strip() == "opened", out
    with PostgresLedger(postgres.url, schema=schema) as ledger:
        assert ledger.accounts() == [] and ledger.replay() == {}


def test_open_ledger_picks_the_backend_from_the_location(
    postgres: PostgresServer, schema: str, tmp_path: Path
) -> None:
    assert is_postgres_url(postgres.url) and not is_postgres_url(str(tmp_path / "l.db"))
    with open_ledger(postgres.url, schema=schema) as pg:
        assert isinstance(pg, PostgresLedger) and pg.schema == schema
    with open_ledger(str(tmp_path / "new" / "dir" / "l.db")) as lite:  # the folder is made
        assert isinstance(lite, Ledger)
    (tmp_path / "file").write_text("")
    with pytest.raises(LedgerError, match="directory"):
        open_ledger(str(tmp_path / "file" / "l.db"))


@pytest.mark.integration
def test_a_partition_or_a_stuck_statement_cannot_hold_the_ledger_for_good(
    postgres: PostgresServer, schema: str
) -> None:
    """[21] 2: the connection carries TCP keepalives and a TCP user timeout, and the session a
    statement timeout, each at the ledger's timeout."""
    ledger = PostgresLedger(postgres.url, schema=schema, timeout=6.0)
    try:
        conn = ledger._live()
        assert conn.execute("SHOW statement_timeout").fetchone() == ("6s",)
        assert conn.execute("SHOW lock_timeout").fetchone() == ("6s",)
        params = conn.info.get_parameters()
        assert (params["keepalives"], params["keepalives_count"]) == ("1", "3")
        assert (params["keepalives_idle"], params["keepalives_interval"]) == ("2", "1")
        assert params["tcp_user_timeout"] == "6000"
    finally:
        ledger.close()
