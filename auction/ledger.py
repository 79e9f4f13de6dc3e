"""The ledger: budgets, holds and VCG charges, money never lost or taken twice (design §1).

An account holds a budget B_i. A plain charge is keyed by (batch_id, user), so the same batch can
never bill a user twice, whoever retries it (the simulator's use). The service reserves a bid as a
hold when a request is admitted and captures the request's VCG share from it when the request is
answered (``auction/holds.py``: the arithmetic, the capture key and the invariant S_i + H_i ≤ B_i).
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
(``auction/money.py``).

Files. Opening a file that is not a ledger (garbage, or a SQLite database with other tables) raises
``LedgerCorruptError`` naming the path and changes nothing in it; any other SQLite failure (a
missing directory, a lock held past ``timeout``) raises ``LedgerError`` naming the path. No raw
``sqlite3`` exception leaves the ledger. A ledger written before holds existed (schema 1: no
``holds`` table, journal keyed by (batch_id, user)) is upgraded in place, in one transaction, the
first time it is opened.
"""

from __future__ import annotations

import math
import numbers
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from auction.holds import HoldBook
from auction.ledger_schema import UPGRADES, VERSION, schema, schema_of
from auction.money import (
    MAX_AMOUNT,
    MAX_MICROS,
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
    check_key,
    check_user,
    to_micros,
    units,
)

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


class Ledger(HoldBook):
    """Accounts, holds and keyed charges in a SQLite file (one ``Ledger`` per process or thread).

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

    def __init__(self, path: str | Path, *, timeout: float = 30.0) -> None:
        given: object = timeout  # typed float, but callers are not type-checked
        if (
            isinstance(given, bool)
            or not isinstance(given, numbers.Real)
            or not math.isfinite(given)
            or given <= 0
        ):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        if not isinstance(path, str | os.PathLike):
            raise ValueError(f"path must be a file path, got {path!r}")
        self.path = Path(path)
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

    # -- accounts ------------------------------------------------------------------------------

    def open_account(self, user: str, budget: float) -> Account:
        """Create ``user`` with ``budget``; opening it again with the same budget is a no-op."""
        check_user(user)
        micros = to_micros(budget, "budget")
        with self._transaction() as db:
            row = db.execute("SELECT budget FROM accounts WHERE user = ?", (user,)).fetchone()
            if row is None:
                db.execute("INSERT INTO accounts (user, budget) VALUES (?, ?)", (user, micros))
            elif self._stored(row[0], user) != micros:
                raise LedgerError(
                    f"account {user!r} already exists with budget {units(row[0])}, "
                    f"not {units(micros)}"
                )
        return self.account(user)

    def account(self, user: str) -> Account:
        check_user(user)
        with self._sqlite_errors():
            budget, spent = self._account_micros(self._db, user)
        return Account(user=user, budget=units(budget), spent=units(spent))

    def accounts(self) -> list[Account]:
        with self._sqlite_errors():
            query = "SELECT user, budget, spent FROM accounts ORDER BY user"
            rows = self._db.execute(query).fetchall()
        return [
            Account(str(u), units(self._stored(b, u)), units(self._stored(s, u)))
            for u, b, s in rows
        ]

    def _stored(self, micros: object, where: object) -> int:
        """A stored amount, checked: SQLite's INTEGER affinity still lets a forged row hold text
        or a real, and nothing in the schema caps it at MAX_AMOUNT."""
        if type(micros) is not int or not 0 <= micros <= MAX_MICROS:
            raise LedgerCorruptError(
                f"{self.path}: {where!r} holds {micros!r}, not an amount in micro-units "
                f"within [0, {MAX_MICROS}]"
            )
        return micros

    def balance(self, user: str) -> float:
        """The remaining budget of ``user``: B_i − S_i (``available`` also subtracts holds)."""
        return self.account(user).balance

    # -- charges -------------------------------------------------------------------------------

    def charge(self, batch_id: str, user: str, amount: float) -> Charge:
        """Charge ``user`` ``amount`` for ``batch_id`` (a non-empty string), exactly once.

        Returns the journal row. A repeat of the key with the same amount returns the original
        row and charges nothing; with another amount it raises ``ChargeConflictError``. Raises
        ``BudgetExceeded`` (writing nothing) if the amount is above B_i − S_i − H_i (the open
        holds count as spent) and ``UnknownAccountError`` for a user without an account.
        """
        key = check_key(batch_id, "batch_id")
        check_user(user)
        micros = to_micros(amount)
        with self._transaction() as db:
            done = db.execute(
                "SELECT seq, amount, balance_after FROM journal "
                "WHERE batch_id = ? AND user = ? AND hold_id = ''",
                (key, user),
            ).fetchone()
            if done is not None:
                done_micros = self._stored(done[1], f"journal row {done[0]}")
                if done_micros != micros:
                    raise ChargeConflictError(
                        f"batch {key!r} already charged {user!r} {units(done_micros)}, "
                        f"not {units(micros)}"
                    )
                after = self._stored(done[2], f"journal row {done[0]}")
                return Charge(int(done[0]), key, user, units(done_micros), units(after))
            budget, spent = self._account_micros(db, user)
            left = budget - spent
            free = left - self._held_micros(db, user)
            if micros > free:
                raise BudgetExceeded(user, units(micros), units(free))
            cursor = db.execute(
                "INSERT INTO journal (batch_id, user, amount, balance_after) VALUES (?, ?, ?, ?)",
                (key, user, micros, left - micros),
            )
            db.execute("UPDATE accounts SET spent = spent + ? WHERE user = ?", (micros, user))
            seq = cursor.lastrowid
        assert seq is not None
        return Charge(seq, key, user, units(micros), units(left - micros))

    def journal(self, user: str | None = None) -> list[Charge]:
        """The charges and captures in commit order (of one user, or all)."""
        if user is not None:
            check_user(user)
        query = "SELECT seq, batch_id, user, amount, balance_after, hold_id FROM journal"
        with self._sqlite_errors():
            rows = (
                self._db.execute(query + " ORDER BY seq").fetchall()
                if user is None
                else self._db.execute(query + " WHERE user = ? ORDER BY seq", (user,)).fetchall()
            )
        return [
            Charge(
                int(s),
                str(k),
                str(u),
                units(self._stored(a, f"journal row {s}")),
                units(self._stored(b, f"journal row {s}")),
                str(h),
            )
            for s, k, u, a, b, h in rows
        ]

    def replay(self) -> dict[str, Account]:
        """Rebuild every account from its budget and the journal, and check them and the holds.

        Raises ``LedgerCorruptError`` if a running balance goes negative or disagrees with the
        balance stored in its row, if the accounts' ``spent`` differs from the journal's sum, or
        if the holds disagree with their captures or exceed a budget (``HoldBook._replay_holds``).
        """
        with self._transaction(write=False) as db:  # one snapshot, whatever others write
            budgets = {
                str(u): (self._stored(b, u), self._stored(s, u))
                for u, b, s in db.execute("SELECT user, budget, spent FROM accounts")
            }
            spent = dict.fromkeys(budgets, 0)
            captures: dict[int, tuple[str, str, int]] = {}
            for seq, user, amount, after, hold_id in db.execute(
                "SELECT seq, user, amount, balance_after, hold_id FROM journal ORDER BY seq"
            ):
                if user not in budgets:
                    raise LedgerCorruptError(
                        f"{self.path}: journal row {seq} charges unknown account {user!r}"
                    )
                micros = self._stored(amount, f"journal row {seq}")
                spent[user] += micros
                balance = budgets[user][0] - spent[user]
                if balance < 0 or balance != self._stored(after, f"journal row {seq}"):
                    raise LedgerCorruptError(
                        f"{self.path}: journal row {seq}: running balance of {user!r} is "
                        f"{units(balance)}, row says {units(int(after))}"
                    )
                if hold_id != "":
                    captures[int(seq)] = (str(user), str(hold_id), micros)
            self._replay_holds(db, {u: b for u, (b, _) in budgets.items()}, spent, captures)
        for user, (_, recorded) in budgets.items():
            if recorded != spent[user]:
                raise LedgerCorruptError(
                    f"{self.path}: account {user!r} records {units(recorded)} spent, "
                    f"its journal sums to {units(spent[user])}"
                )
        return {u: Account(u, units(b), units(spent[u])) for u, (b, _) in budgets.items()}

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
