"""The ledger: budgets, holds and VCG charges, money never lost or taken twice (design §1).

An account holds a budget B_i. A plain charge is keyed by (batch_id, user), so the same batch can
never bill a user twice, whoever retries it (the simulator's use). The service reserves a bid as a
hold when a request is admitted and captures the request's VCG share from it when the request is
answered (``cluster/ledger/holds.py``: the arithmetic, the capture key and the invariant S_i + H_i
≤ B_i).
Charges and captures share one append-only journal in SQLite (WAL mode), replayed (re-added and
checked, holds included) when a ledger is opened.

Guarantees, and what provides them:

- Durable before a write returns: every charge, reserve, capture and release is one transaction,
  committed with ``synchronous=FULL`` (the WAL is fsynced at commit), so a process killed after
  the call returned (even with SIGKILL) keeps it; one killed before the commit leaves no trace.
- Exactly once: ``UNIQUE(batch_id, user, hold_id)`` with ``hold_id = ''`` for plain charges, and a
  unique ``hold_id`` among captures. A repeated charge with the same amount is a no-op that
  returns the original ``Charge``; with another amount it raises ``ChargeConflictError``.
- Never past the budget: the check and the write run in one ``BEGIN IMMEDIATE`` transaction, which
  takes the database's write lock first, so concurrent writers (threads or processes, each with
  its own ``Ledger``) are serialised; ``CHECK(spent <= budget)`` and triggers on S_i + H_i back it
  in the schema. An overdraft raises ``BudgetExceeded`` and writes nothing.
- Append-only: triggers reject UPDATE and DELETE on the journal (and any change to a hold but
  closing it once). Each row keeps the balance B_i − S_i after it, so ``replay`` can check that
  the running balances agree with the accounts.

Money is integer micro-units, bounded by ``MAX_AMOUNT``; keys are non-empty strings
(``auction/money.py``). The queries are the backends' common ones (``cluster/ledger/book.py``,
``cluster/ledger/holds.py``); clusters keep the same contract in PostgreSQL (``cluster.ledger``).

Files. Opening a file that is not a ledger (garbage, or a SQLite database with other tables) raises
``LedgerCorruptError`` naming the path and changes nothing in it; any other SQLite failure (a
missing directory, a lock held past ``timeout``) raises ``LedgerError`` naming the path. No raw
``sqlite3`` exception leaves the ledger. A ledger written before holds existed (schema 1: no
``holds`` table, journal keyed by (batch_id, user)) is upgraded in place, in one transaction, the
first time it is opened.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from auction.money import (
    MAX_AMOUNT,
    MICROS,
    Account,
    BudgetExceeded,
    Charge,
    ChargeConflictError,
    Hold,
    HoldError,
    LedgerCorruptError,
    LedgerError,
    UnknownAccountError,
    UnknownHoldError,
    to_micros,
)
from cluster.ledger.book import LedgerBook, check_timeout
from cluster.ledger.schema import UPGRADES, VERSION, schema, schema_of

__all__ = [
    "MAX_AMOUNT",
    "MICROS",
    "Account",
    "BudgetExceeded",
    "Charge",
    "ChargeConflictError",
    "Hold",
    "HoldError",
    "Ledger",
    "LedgerCorruptError",
    "LedgerError",
    "UnknownAccountError",
    "UnknownHoldError",
    "to_micros",
]


class Ledger(LedgerBook):
    """Accounts, holds and keyed charges in a SQLite file (one ``Ledger`` per process or thread);
    the laptop's default. Clusters keep theirs in PostgreSQL (``cluster.ledger``).

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d, Ledger(os.path.join(d, "l.db")) as ledger:
    ...     _ = ledger.open_account("alice", 10.0)
    ...     first = ledger.charge("batch-1", "alice", 4.0)
    ...     again = ledger.charge("batch-1", "alice", 4.0)   # a retry: no second charge
    ...     _ = ledger.reserve("req-7", "alice", 5.0)         # a bid, held at admission
    ...     paid = ledger.capture("req-7", "batch-2", 1.5)    # its VCG share, when answered
    ...     (again == first, ledger.balance("alice"), ledger.held("alice"), paid.amount)
    (True, 4.5, 0.0, 1.5)
    """

    path: Path
    _db: sqlite3.Connection
    _hold_order = "rowid"

    def __init__(self, path: str | Path, *, timeout: float = 30.0) -> None:
        timeout = check_timeout(timeout)
        if not isinstance(path, str | os.PathLike):
            raise ValueError(f"path must be a file path, got {path!r}")
        self.path = Path(path)
        self.where = str(self.path)
        if sqlite3.sqlite_version_info < (3, 35):  # INSERT … RETURNING (cluster/ledger/sql.py)
            raise LedgerError(f"{self.path}: SQLite {sqlite3.sqlite_version} is older than 3.35")
        with self._sqlite_errors():
            # Autocommit mode: every transaction below is explicit (BEGIN IMMEDIATE ... COMMIT).
            self._db = sqlite3.connect(str(self.path), timeout=float(timeout), isolation_level=None)
        try:
            with self._sqlite_errors():
                # Read before writing anything: a file that is not a ledger is left as it was.
                self._schema_version()
                mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":  # e.g. a file system without shared memory
                    raise LedgerError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("PRAGMA foreign_keys=ON")
                with self._transaction():
                    # Under the write lock: another process may have created it meanwhile.
                    version = self._schema_version()
                    if version < VERSION:
                        for statement in UPGRADES[version]:
                            self._db.execute(statement)
                        if schema_of(self._db) != schema(VERSION):  # never commit a half schema
                            raise LedgerCorruptError(f"{self.path}: the schema upgrade failed")
            self.replay()  # refuse to open a journal that does not add up
        except BaseException:
            self._db.close()
            raise

    def _schema_version(self) -> int:
        """0 for an empty database (a new file), 1 to ``VERSION`` for a ledger's schema;
        ``LedgerCorruptError`` naming the path for anything else."""
        found = schema_of(self._db)
        if not found:
            return 0
        for version in range(VERSION, 0, -1):
            if found == schema(version):
                return version
        names = ", ".join(sorted({name for _, name, _, _ in found})) or "nothing"
        raise LedgerCorruptError(
            f"{self.path} is not a ledger: its schema differs from the ledger's (it holds {names})"
        )

    # -- transactions -------------------------------------------------------------------------

    @contextmanager
    def _sqlite_errors(self) -> Iterator[None]:
        """Turn SQLite's exceptions into the ledger's, naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            code = getattr(exc, "sqlite_errorname", "")
            if code in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
                raise LedgerCorruptError(f"{self.path} is not a readable ledger: {exc}") from exc
            raise LedgerError(f"{self.path}: {exc}") from exc

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """A writer begins IMMEDIATE: it takes the write lock before it reads, so check-then-write
        is atomic across processes. A reader gets a consistent snapshot (WAL) without the lock."""
        with self._sqlite_errors():
            self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # also when COMMIT itself failed: never leave it open
                    self._db.execute("ROLLBACK")
                raise

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()
