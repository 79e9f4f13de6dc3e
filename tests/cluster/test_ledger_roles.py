"""The ledger's client is not its owner (cluster/ledger/postgres_roles.py), on a real server: the
chart's init script, run with psql as a superuser would run it, leaves a client role that keeps
the books through ``PostgresLedger`` and can neither lift the schema's guards nor make objects."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cluster.ledger.postgres import PASSWORD_FILE_ENV, PostgresLedger, password_from_file
from cluster.ledger.postgres_roles import roles_script
from cluster.ledger.sqlite import LedgerError
from tests.postgres_server import PostgresServer, _install_dir

pytestmark = pytest.mark.integration

CHART_SCRIPT = Path(__file__).resolve().parents[2] / "helm/disaggctl/files/ledger-roles.psql"


def test_the_charts_script_is_the_projects() -> None:
    assert CHART_SCRIPT.read_text() == roles_script(), (
        "regenerate: python -m cluster.ledger.postgres_roles"
        " > helm/disaggctl/files/ledger-roles.psql"
    )


@pytest.fixture
def provisioned(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str]]:
    """A fresh database provisioned by the chart's script; yields (client URL, schema), the
    client's password in a file that DISAGG_LEDGER_PASSWORD_FILE names."""
    tag = uuid.uuid4().hex[:10]
    database, user, schema = f"db_{tag}", f"ledger_{tag}", f"books_{tag}"
    password = f"pw-{tag}-' ; DROP ROLE x; --"  # a literal, never SQL
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    done = subprocess.run(
        [str(_install_dir() / "bin" / "psql"), "-X", "-q", "-h", "127.0.0.1",
         "-p", str(postgres.port), "-U", "disaggctl", "-d", database,
         "-v", f"ledger_user={user}", "-v", f"ledger_schema={schema}",
         "-v", f"ledger_password={password}", "-f", str(CHART_SCRIPT)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PGPASSWORD": postgres.password},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    secret = tmp_path / "password"
    secret.write_text(password + "\n")
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(secret))
    monkeypatch.delenv("PGPASSWORD")  # the client's only password is the file's
    yield f"postgresql://{user}@127.0.0.1:{postgres.port}/{database}", schema
    monkeypatch.setenv("PGPASSWORD", postgres.password)


def test_the_client_keeps_the_books_and_cannot_lift_the_guards(
    provisioned: tuple[str, str],
) -> None:
    url, schema = provisioned
    with PostgresLedger(url, schema=schema) as ledger:
        ledger.open_account("alice", 5.0)
        ledger.charge("b0", "alice", 0.5)
        ledger.reserve("r1", "alice", 2.0, owner="replica-a", expires=1e12)
        ledger.capture("r1", "b1", 1.0)
        ledger.reserve("r2", "alice", 1.0)
        ledger.release("r2")
    with PostgresLedger(url, schema=schema) as again:  # opens what the owner made, creates nothing
        assert again.account("alice").spent == pytest.approx(1.5)
        assert again.held("alice") == 0.0

    with psycopg.connect(url, autocommit=True, **password_from_file()) as client:
        client.execute(f'SET search_path TO "{schema}"')
        (superuser,) = client.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()  # fmt: skip
        assert superuser is False
        for attempt, refusal in (
            ("SET session_replication_role = replica", "permission denied"),
            ("ALTER TABLE journal DISABLE TRIGGER ALL", "must be owner"),
            ("ALTER TABLE accounts DROP CONSTRAINT accounts_check", "must be owner"),
            ("DROP TABLE holds", "must be owner"),
            ("DROP FUNCTION refuse()", "must be owner"),
            ("UPDATE journal SET amount = 0", "permission denied"),  # no grant, and the trigger
            (
                "UPDATE holds SET amount = 0 WHERE hold_id = 'r1'",
                "only closes",
            ),  # the trigger binds
            ("UPDATE accounts SET spent = budget + 1", "exceeds the budget"),
            ("DELETE FROM accounts", "permission denied"),
            ("TRUNCATE journal", "permission denied"),
            ("CREATE TABLE mine (x int)", "permission denied"),
            ("CREATE TABLE public.mine (x int)", "permission denied"),
            ("SET ROLE " + url.split("//")[1].split("@")[0] + "_owner", "permission denied"),
        ):
            with pytest.raises(psycopg.Error) as refused:
                client.execute(attempt)
            assert refusal in str(refused.value), attempt
        (spent,) = client.execute("SELECT spent FROM accounts").fetchone()
        assert spent == 1_500_000  # micro-units: the books as the ledger left them


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"", "empty"), (b"x" * 2000, "over 1024 bytes"), (b"\xff\xfe", "not UTF-8")],
)
def test_a_bad_password_file_is_a_ledger_error_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, reason: str
) -> None:
    path = tmp_path / "password"
    path.write_bytes(content)
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(path))
    with pytest.raises(LedgerError, match=f"{PASSWORD_FILE_ENV}.*{reason}"):
        password_from_file()
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(tmp_path / "absent"))
    with pytest.raises(LedgerError, match="cannot read it"):
        password_from_file()
    monkeypatch.delenv(PASSWORD_FILE_ENV)
    assert password_from_file() == {}
