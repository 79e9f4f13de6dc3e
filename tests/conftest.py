"""The whole suite's NATS credentials: one set per test session (``cluster.nats_auth``); and
the session's PostgreSQL server, for the ledger's tests.

Named in the environment before anything starts, so every nats-server a test starts is
configured with them and every process it starts (Ray's workers, ``disaggctl serve`` in a
subprocess, Dynamo's processes) finds them, as a deployment's processes would."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.nats_auth import CREDENTIALS_ENV, generate_credentials
from tests.ledger_backends import BACKENDS, LedgerAt
from tests.ledger_backends import ledger_at as _ledger_at
from tests.postgres_server import PostgresServer

_CREDENTIALS = tempfile.mkdtemp(prefix="disagg-creds-")
generate_credentials(_CREDENTIALS)
os.environ[CREDENTIALS_ENV] = _CREDENTIALS


def pytest_unconfigure() -> None:
    shutil.rmtree(_CREDENTIALS, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session (started when a test first asks for it); its
    password in ``PGPASSWORD``, where libpq, and every process a test starts, find it."""
    with PostgresServer() as server:
        before = os.environ.get("PGPASSWORD")
        os.environ.update(server.env)
        try:
            yield server
        finally:
            if before is None:
                os.environ.pop("PGPASSWORD", None)
            else:
                os.environ["PGPASSWORD"] = before


@pytest.fixture(params=BACKENDS)
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> LedgerAt:
    """A fresh ledger location: the test runs once on SQLite, once on PostgreSQL."""
    return _ledger_at(request.param, tmp_path, request)
