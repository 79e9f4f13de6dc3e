"""The ledger: budgets and VCG charges as money that is never lost or taken twice (docs/design.md §1).

An account holds a budget B_i; a charge is keyed by (batch_id, user), so the same batch can never
bill a user twice, whoever retries it. The journal of charges is append-only, lives in SQLite in WAL
mode and is replayed (re-added and checked) when a ledger is opened.

Guarantees, and what provides them:

- Durable before ``charge`` returns: every charge is one transaction, committed with
  ``synchronous=FULL`` (the WAL is fsynced at commit), so a process killed after the call returned
  (even with SIGKILL) keeps the charge; one killed before the commit leaves no trace of it.
- Exactly once: ``UNIQUE(batch_id, user)``. A repeated charge with the same amount is a no-op that
  returns the original ``Charge``; with another amount it raises ``ChargeConflictError``.
- Never negative: the budget check and the insert run in one ``BEGIN IMMEDIATE`` transaction, which
  takes the database's write lock first, so concurrent writers (threads or processes, each with its
  own ``Ledger``) are serialised; ``CHECK(spent <= budget)`` backs it in the schema. An overdraft
  raises ``BudgetExceeded`` and writes nothing.
- Append-only: triggers reject UPDATE and DELETE on the journal. Each row keeps the balance after
  it, so ``replay`` can check that the running balances agree with the accounts.

Money is stored as integer micro-units (10⁻⁶ of the budget's currency): sums are exact, and an
amount is rounded to the nearest micro-unit once, when it enters the ledger.
"""

from __future__ import annotations

import math
import numbers
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

MICROS = 1_000_000
"""Micro-units per unit of money."""

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS accounts (
        user    TEXT PRIMARY KEY,
        budget  INTEGER NOT NULL CHECK (budget >= 0),
        spent   INTEGER NOT NULL DEFAULT 0 CHECK (spent >= 0 AND spent <= budget)
    )""",
    """CREATE TABLE IF NOT EXISTS journal (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
        batch_id       TEXT NOT NULL,
        user           TEXT NOT NULL REFERENCES accounts(user),
        amount         INTEGER NOT NULL CHECK (amount >= 0),
        balance_after  INTEGER NOT NULL CHECK (balance_after >= 0),
        UNIQUE (batch_id, user)
    )""",
    """CREATE TRIGGER IF NOT EXISTS journal_no_update BEFORE UPDATE ON journal
       BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS journal_no_delete BEFORE DELETE ON journal
       BEGIN SELECT RAISE(ABORT, 'the journal is append-only'); END""",
)


class LedgerError(Exception):
    """Base class of the ledger's refusals."""


class BudgetExceeded(LedgerError):  # noqa: N818  (the name the callers were promised)
    """A charge would take an account below zero; nothing was written."""

    def __init__(self, user: str, amount: float, balance: float) -> None:
        super().__init__(
            f"charge of {amount:.6f} to {user!r} exceeds its remaining budget {balance:.6f}"
        )
        self.user, self.amount, self.balance = user, amount, balance


class UnknownAccountError(LedgerError):
    """No account with this user id."""


class ChargeConflictError(LedgerError):
    """The key (batch_id, user) was already charged with a different amount."""


class LedgerCorruptError(LedgerError):
    """Replaying the journal does not reproduce the accounts."""


@dataclass(frozen=True)
class Account:
    user: str
    budget: float
    spent: float

    @property
    def balance(self) -> float:
        """What is left: budget − spent (never negative)."""
        return self.budget - self.spent


@dataclass(frozen=True)
class Charge:
    """One journal row: the charge of ``user`` for ``batch_id`` and the balance it left."""

    seq: int
    batch_id: str
    user: str
    amount: float
    balance_after: float


def to_micros(amount: object, what: str = "amount") -> int:
    """An amount of money as integer micro-units, rounded to the nearest one.

    >>> to_micros(1.5), to_micros(0.0000014)
    (1500000, 1)
    """
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise ValueError(f"{what} must be a number, got {amount!r}")
    value = float(amount)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be finite and >= 0, got {amount!r}")
    return round(value * MICROS)


def _units(micros: int) -> float:
    return micros / MICROS


class Ledger:
    """Accounts and their keyed charges in a SQLite file (one ``Ledger`` per process or thread).

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d, Ledger(os.path.join(d, "l.db")) as ledger:
    ...     _ = ledger.open_account("alice", 10.0)
    ...     first = ledger.charge("batch-1", "alice", 4.0)
    ...     again = ledger.charge("batch-1", "alice", 4.0)   # a retry: no second charge
    ...     (again == first, ledger.balance("alice"))
    (True, 6.0)
    """

    def __init__(self, path: str | Path, *, timeout: float = 30.0) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout!r}")
        self.path = Path(path)
        # Autocommit mode: every transaction below is explicit (BEGIN IMMEDIATE ... COMMIT).
        self._db = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        try:
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":  # e.g. a file system without shared memory
                raise LedgerError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            with self._transaction() as db:
                for statement in _SCHEMA:
                    db.execute(statement)
            self.replay()  # refuse to open a journal that does not add up
        except BaseException:
            self._db.close()
            raise

    # -- transactions -------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool = True) -> Iterator[sqlite3.Connection]:
        """A writer begins IMMEDIATE: it takes the write lock before it reads, so check-then-write
        is atomic across processes. A reader gets a consistent snapshot (WAL) without the lock."""
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
        _check_user(user)
        micros = to_micros(budget, "budget")
        with self._transaction() as db:
            row = db.execute("SELECT budget FROM accounts WHERE user = ?", (user,)).fetchone()
            if row is None:
                db.execute("INSERT INTO accounts (user, budget) VALUES (?, ?)", (user, micros))
            elif int(row[0]) != micros:
                raise LedgerError(
                    f"account {user!r} already exists with budget {_units(int(row[0]))}, "
                    f"not {_units(micros)}"
                )
        return self.account(user)

    def account(self, user: str) -> Account:
        row = self._db.execute(
            "SELECT budget, spent FROM accounts WHERE user = ?", (user,)
        ).fetchone()
        if row is None:
            raise UnknownAccountError(f"no account {user!r}")
        return Account(user=user, budget=_units(int(row[0])), spent=_units(int(row[1])))

    def accounts(self) -> list[Account]:
        rows = self._db.execute("SELECT user, budget, spent FROM accounts ORDER BY user").fetchall()
        return [Account(str(u), _units(int(b)), _units(int(s))) for u, b, s in rows]

    def balance(self, user: str) -> float:
        """The remaining budget of ``user``."""
        return self.account(user).balance

    # -- charges -------------------------------------------------------------------------------

    def charge(self, batch_id: str | int, user: str, amount: float) -> Charge:
        """Charge ``user`` ``amount`` for ``batch_id``, exactly once.

        Returns the journal row. A repeat of the key with the same amount returns the original
        row and charges nothing; with another amount it raises ``ChargeConflictError``. Raises
        ``BudgetExceeded`` (writing nothing) if the balance would go negative and
        ``UnknownAccountError`` for a user without an account.
        """
        key = _batch_key(batch_id)
        _check_user(user)
        micros = to_micros(amount)
        with self._transaction() as db:
            done = db.execute(
                "SELECT seq, amount, balance_after FROM journal WHERE batch_id = ? AND user = ?",
                (key, user),
            ).fetchone()
            if done is not None:
                if int(done[1]) != micros:
                    raise ChargeConflictError(
                        f"batch {key!r} already charged {user!r} {_units(int(done[1]))}, "
                        f"not {_units(micros)}"
                    )
                return Charge(int(done[0]), key, user, _units(int(done[1])), _units(int(done[2])))
            query = "SELECT budget, spent FROM accounts WHERE user = ?"
            row = db.execute(query, (user,)).fetchone()
            if row is None:
                raise UnknownAccountError(f"no account {user!r}")
            left = int(row[0]) - int(row[1])
            if micros > left:
                raise BudgetExceeded(user, _units(micros), _units(left))
            cursor = db.execute(
                "INSERT INTO journal (batch_id, user, amount, balance_after) VALUES (?, ?, ?, ?)",
                (key, user, micros, left - micros),
            )
            db.execute("UPDATE accounts SET spent = spent + ? WHERE user = ?", (micros, user))
            seq = cursor.lastrowid
        assert seq is not None
        return Charge(seq, key, user, _units(micros), _units(left - micros))

    def journal(self, user: str | None = None) -> list[Charge]:
        """The charges in commit order (of one user, or all)."""
        query = "SELECT seq, batch_id, user, amount, balance_after FROM journal"
        rows = (
            self._db.execute(query + " ORDER BY seq").fetchall()
            if user is None
            else self._db.execute(query + " WHERE user = ? ORDER BY seq", (user,)).fetchall()
        )
        return [
            Charge(int(s), str(k), str(u), _units(int(a)), _units(int(b)))
            for s, k, u, a, b in rows
        ]

    def replay(self) -> dict[str, Account]:
        """Rebuild every account from its budget and the journal, and check them.

        Raises ``LedgerCorruptError`` if a running balance goes negative or disagrees with the
        balance stored in its row, or if the accounts' ``spent`` differs from the journal's sum.
        """
        with self._transaction(write=False) as db:  # one snapshot, whatever others write
            budgets = {str(u): (int(b), int(s)) for u, b, s in
                       db.execute("SELECT user, budget, spent FROM accounts")}
            spent = dict.fromkeys(budgets, 0)
            for seq, user, amount, after in db.execute(
                "SELECT seq, user, amount, balance_after FROM journal ORDER BY seq"
            ):
                if user not in budgets:
                    raise LedgerCorruptError(f"journal row {seq} charges unknown account {user!r}")
                spent[user] += int(amount)
                balance = budgets[user][0] - spent[user]
                if balance < 0 or balance != int(after):
                    raise LedgerCorruptError(
                        f"journal row {seq}: running balance of {user!r} is {_units(balance)}, "
                        f"row says {_units(int(after))}"
                    )
        for user, (_, recorded) in budgets.items():
            if recorded != spent[user]:
                raise LedgerCorruptError(
                    f"account {user!r} records {_units(recorded)} spent, "
                    f"its journal sums to {_units(spent[user])}"
                )
        return {u: Account(u, _units(b), _units(spent[u])) for u, (b, _) in budgets.items()}

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


def _check_user(user: object) -> None:
    if not isinstance(user, str) or not user:
        raise ValueError(f"user must be a non-empty string, got {user!r}")


def _batch_key(batch_id: object) -> str:
    if isinstance(batch_id, bool) or not isinstance(batch_id, str | int):
        raise ValueError(f"batch_id must be a string or an integer, got {batch_id!r}")
    key = str(batch_id)
    if not key:
        raise ValueError("batch_id must not be empty")
    return key
