"""The ledger in PostgreSQL, for clusters: the contract of ``cluster.ledger.sqlite`` over a server
that
outlives pods and takes writers from any node (docs/design.md §1 "Ledger", "Security model").

The queries are the SQLite ledger's (``cluster/ledger/book.py``, ``cluster/ledger/holds.py``); this
module supplies the connection, the transactions and the schema (``postgres_schema.py``).

Guarantees, and what provides them here:

- Durable before a write returns: each write is one transaction, and PostgreSQL's commit
  flushes its WAL (``synchronous_commit`` on, the server's default), so a client killed after
  the call returned keeps it and one killed before the commit leaves no trace.
- Never past the budget, exactly once: every write transaction first takes one transaction-level
  advisory lock, keyed by the ledger's schema, so writers (threads, processes, nodes) are
  serialised as SQLite's write lock serialises them, and the check-then-write of a charge, hold
  or capture is atomic. Readers take a ``REPEATABLE READ`` snapshot and no lock. The UNIQUE keys,
  CHECKs and triggers back both in the schema.
- A server that restarts: a broken connection is replaced when the next transaction begins.
  A write whose COMMIT was cut off may or may not have landed; its retry is safe, because every
  write is keyed (a repeated charge or capture returns the original row).

Secrets stay out of the URL, which appears in messages and logs: a URL that holds a password is
refused. The password comes from a file that :data:`PASSWORD_FILE_ENV` names (the Helm chart
mounts its Secret there, so no process's environment holds it), else libpq reads ``PGPASSWORD``
or ``PGPASSFILE``; TLS from the URL's ``sslmode`` and ``sslrootcert``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import TupleRow

from auction.money import LedgerCorruptError, LedgerError
from cluster.ledger.book import LedgerBook, check_timeout
from cluster.ledger.postgres_schema import COLUMNS, TABLES
from cluster.ledger.sql import Rows
from cluster.ledger.urls import SCHEMA_PATTERN, check_postgres_url

__all__ = ["PASSWORD_FILE_ENV", "PostgresLedger", "password_from_file"]

log = logging.getLogger(__name__)

PASSWORD_FILE_ENV = "DISAGG_LEDGER_PASSWORD_FILE"
MAX_PASSWORD_BYTES = 1_024  # a password file larger than this is not one


def password_from_file() -> dict[str, str]:
    """``{"password": …}`` read from the file :data:`PASSWORD_FILE_ENV` names (one trailing
    newline dropped), or ``{}`` when the variable is unset. An error names the variable and the
    path, never the content."""
    path = os.environ.get(PASSWORD_FILE_ENV)
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PASSWORD_BYTES + 1)
    except OSError as exc:
        raise LedgerError(f"{PASSWORD_FILE_ENV}={path}: cannot read it ({exc.strerror})") from None
    if len(raw) > MAX_PASSWORD_BYTES:
        raise LedgerError(f"{PASSWORD_FILE_ENV}={path}: over {MAX_PASSWORD_BYTES} bytes")
    try:
        password = raw.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError:
        raise LedgerError(f"{PASSWORD_FILE_ENV}={path}: not UTF-8 text") from None
    if not password:
        raise LedgerError(f"{PASSWORD_FILE_ENV}={path}: the file is empty")
    return {"password": password}


class _Connection:
    """psycopg's connection speaking the ledger's ``?`` placeholders (cluster/ledger/sql.py).
    No query with parameters holds a literal ``?`` or ``%``, so the translation is exact; a
    statement without parameters (the schema's, whose functions say ``'%'``) goes as it is."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Sequence[object] = (), /) -> Rows:
        if not parameters:
            return self._conn.execute(sql)
        return self._conn.execute(sql.replace("?", "%s"), parameters)


class PostgresLedger(LedgerBook):
    """Accounts, holds and keyed charges in a PostgreSQL schema (module docstring).

    ``url`` is a libpq URL without a password (``postgresql://user@host:5432/db``); ``schema``
    the namespace that holds the ledger's tables, created on first use; ``timeout`` the seconds
    to wait for the connection or for the write lock.
    """

    _hold_order = "seq"

    def __init__(self, url: str, *, schema: str = "disaggctl", timeout: float = 30.0) -> None:
        timeout = check_timeout(timeout)
        if not isinstance(schema, str) or not re.fullmatch(SCHEMA_PATTERN, schema):
            raise ValueError(f"schema must match {SCHEMA_PATTERN}, got {schema!r}")
        self.url = check_postgres_url(url)
        self.schema = schema
        self.where = f"{self.url} (schema {schema})"
        self._timeout = float(timeout)
        # One lock per ledger: two schemas in one database are two ledgers, each its own writer.
        digest = hashlib.blake2b(f"disaggctl-ledger:{schema}".encode(), digest_size=8).digest()
        self._lock_key = int.from_bytes(digest, "big", signed=True)
        self._closed = False
        self._conn: psycopg.Connection[TupleRow] | None = None
        try:
            self._install()
            self.replay()  # refuse to open a journal that does not add up
        except BaseException:
            self.close()
            raise

    # -- connection and transactions -----------------------------------------------------------

    def _connect(self) -> psycopg.Connection[TupleRow]:
        with self._errors():
            timeout_ms = math.ceil(self._timeout * 1000)
            password: dict[str, Any] = password_from_file()  # libpq's keywords are Any to psycopg
            conn = psycopg.connect(
                self.url,
                autocommit=True,  # every transaction below is explicit (BEGIN … COMMIT)
                connect_timeout=max(1, math.ceil(self._timeout)),
                application_name="disaggctl-ledger",
                # A partition must not block the one ledger thread for good: TCP keepalives
                # find a peer that went away, and a request whose bytes go unacknowledged for
                # the ledger's timeout fails the connection (the next call connects again).
                keepalives=1,
                keepalives_idle=max(1, math.ceil(self._timeout / 3)),
                keepalives_interval=max(1, math.ceil(self._timeout / 9)),
                keepalives_count=3,
                tcp_user_timeout=timeout_ms,
                **password,
            )
            try:
                conn.execute(f'SET search_path TO "{self.schema}"')  # matched SCHEMA_PATTERN
                conn.execute(f"SET lock_timeout = {timeout_ms}")
                # The ledger's statements take milliseconds; one the server runs for longer
                # than the timeout is stuck (a lock, a full disk) and is cancelled there.
                conn.execute(f"SET statement_timeout = {timeout_ms}")
            except BaseException:
                conn.close()
                raise
        return conn

    def _live(self) -> psycopg.Connection[TupleRow]:
        """The connection, opened again if the server dropped it (a restart, a failover)."""
        if self._closed:
            raise LedgerError(f"{self.where}: the ledger is closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._conn is not None:
                log.warning("%s: the connection was lost; connecting again", self.where)
                self._conn.close()
            self._conn = self._connect()
        return self._conn

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """psycopg's exceptions as the ledger's, naming the ledger (never its password)."""
        try:
            yield
        except psycopg.errors.DataCorrupted as exc:
            raise LedgerCorruptError(f"{self.where}: {exc}") from exc
        except psycopg.Error as exc:
            raise LedgerError(f"{self.where}: {exc}".rstrip()) from exc

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[_Connection]:
        """A writer takes the ledger's advisory lock before it reads, so check-then-write is
        atomic across processes; a reader gets a consistent snapshot without it."""
        with self._errors():
            begin = "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
            conn = self._live()
            try:
                conn.execute(begin)
            except psycopg.OperationalError:
                if not conn.broken:
                    raise
                # The server went away since the last transaction (a restart): nothing was
                # sent yet, so connecting again and beginning anew is safe.
                conn = self._live()
                conn.execute(begin)
            try:
                if write:
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                yield _Connection(conn)
                conn.execute("COMMIT")
            except BaseException:
                if not conn.broken and conn.info.transaction_status in (
                    pq.TransactionStatus.INTRANS,
                    pq.TransactionStatus.INERROR,
                ):
                    conn.execute("ROLLBACK")
                raise

    # -- the schema ----------------------------------------------------------------------------

    def _install(self) -> None:
        """Create the ledger's tables in an empty schema; check them in one that has tables.
        Under the write lock, so two processes opening a new ledger create it once. A schema
        that exists is never created again: a client without the right to create (the roles
        of ``postgres_roles.py``) opens the ledger its owner made."""
        with self._transaction() as db:
            exists = db.execute("SELECT 1 FROM pg_namespace WHERE nspname = ?", (self.schema,))
            if exists.fetchone() is None:
                db.execute(f'CREATE SCHEMA "{self.schema}"')
            found = frozenset(
                (str(t), str(c), str(d))
                for t, c, d in db.execute(
                    "SELECT table_name, column_name, data_type FROM information_schema.columns "
                    "WHERE table_schema = ?",
                    (self.schema,),
                )
            )
            if not found:
                for statement in TABLES:
                    db.execute(statement)
            elif found != COLUMNS:
                tables = ", ".join(sorted({t for t, _, _ in found}))
                raise LedgerCorruptError(
                    f"{self.where} is not a ledger: its tables differ from the ledger's "
                    f"(it holds {tables})"
                )

    def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
