"""The ledger: budgets and VCG charges as money never lost or taken twice (docs/design.md §1).

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
amount is rounded to the nearest micro-unit once, when it enters the ledger (exactly, from the
float's binary value). Budgets and amounts are finite, ≥ 0 and at most ``MAX_AMOUNT`` = 10¹² units:
10¹⁸ micro-units, which SQLite's signed 64-bit INTEGER holds with a factor 9 to spare (it tops out
at 2⁶³ − 1 ≈ 9.2·10¹⁸), so a sum of up to nine full budgets still fits. A budget of 10¹³ (10¹⁹
micro-units) used to overflow the column. ``MAX_AMOUNT`` is a thousand maximal bids
(auction/request.py, ``MAX_BID`` = 10⁹).

Keys. A charge is keyed by ``(batch_id, user)``, both non-empty strings. Batch ids are strings
only: an integer id would be stored as its decimal text and so collide with the string of the
same digits (1 and "1" were one key); a caller with integer batch numbers converts them itself,
once, the same way everywhere (e.g. ``f"batch-{k}"``).

Files. Opening a file that is not a ledger (garbage, or a SQLite database with other tables) raises
``LedgerCorruptError`` naming the path and changes nothing in it; any other SQLite failure (a
missing directory, a lock held past ``timeout``) raises ``LedgerError`` naming the path. No raw
``sqlite3`` exception leaves the ledger.
"""

from __future__ import annotations

import math
import numbers
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from pathlib import Path
from types import TracebackType
from typing import Final

MICROS: Final = 1_000_000
"""Micro-units per unit of money."""

MAX_AMOUNT: Final = 1e12
"""Largest budget or charge, in units of money (10¹⁸ micro-units; see the module docstring)."""

_MAX_MICROS: Final = 10**18

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
    """The file is not a ledger (not SQLite, or not this schema), or replaying its journal does
    not reproduce its accounts."""


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

    The float's exact binary value is scaled (``Fraction``), so the rounding is right for every
    amount up to ``MAX_AMOUNT``, where ``amount * 10**6`` in floating point would be off by up to
    64 micro-units. Raises ``ValueError`` naming ``what`` unless the amount is a real number,
    finite, ≥ 0 and ≤ ``MAX_AMOUNT``.

    >>> to_micros(1.5), to_micros(0.0000014), to_micros(MAX_AMOUNT) == 10**18
    (1500000, 1, True)
    """
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise ValueError(f"{what} must be a number, got {amount!r}")
    try:
        value = float(amount)
    except OverflowError:  # an int past float64's range is past MAX_AMOUNT as well
        raise ValueError(f"{what} must be <= MAX_AMOUNT = {MAX_AMOUNT:g}, got {amount!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be finite and >= 0, got {amount!r}")
    if value > MAX_AMOUNT:
        raise ValueError(f"{what} must be <= MAX_AMOUNT = {MAX_AMOUNT:g}, got {amount!r}")
    return round(Fraction(value) * MICROS)


def _units(micros: int) -> float:
    return micros / MICROS


@cache
def _ledger_schema() -> frozenset[tuple[str, str, str, str | None]]:
    """(type, name, table, sql) of every object the schema creates, as SQLite records them."""
    db = sqlite3.connect(":memory:")
    try:
        for statement in _SCHEMA:
            db.execute(statement)
        return _schema_of(db)
    finally:
        db.close()


def _schema_of(db: sqlite3.Connection) -> frozenset[tuple[str, str, str, str | None]]:
    """The user objects in a database (SQLite's own, ``sqlite_*``, left out)."""
    rows = db.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return frozenset(
        (str(kind), str(name), str(table), None if sql is None else str(sql))
        for kind, name, table, sql in rows
    )


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
                self._is_new_file()
                mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":  # e.g. a file system without shared memory
                    raise LedgerError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.execute("PRAGMA foreign_keys=ON")
                with self._transaction():
                    # Under the write lock: another process may have created it meanwhile.
                    if self._is_new_file():
                        for statement in _SCHEMA:
                            self._db.execute(statement)
            self.replay()  # refuse to open a journal that does not add up
        except BaseException:
            self._db.close()
            raise

    def _is_new_file(self) -> bool:
        """True for an empty database (a new file), False for one with the ledger's schema;
        ``LedgerCorruptError`` naming the path for anything else."""
        found = _schema_of(self._db)
        if not found:
            return True
        if found != _ledger_schema():
            names = ", ".join(sorted({name for _, name, _, _ in found})) or "nothing"
            raise LedgerCorruptError(
                f"{self.path} is not a ledger: its schema differs from the ledger's "
                f"(it holds {names})"
            )
        return False

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
        _check_user(user)
        micros = to_micros(budget, "budget")
        with self._transaction() as db:
            row = db.execute("SELECT budget FROM accounts WHERE user = ?", (user,)).fetchone()
            if row is None:
                db.execute("INSERT INTO accounts (user, budget) VALUES (?, ?)", (user, micros))
            elif self._stored(row[0], user) != micros:
                raise LedgerError(
                    f"account {user!r} already exists with budget {_units(row[0])}, "
                    f"not {_units(micros)}"
                )
        return self.account(user)

    def account(self, user: str) -> Account:
        _check_user(user)
        with self._sqlite_errors():
            row = self._db.execute(
                "SELECT budget, spent FROM accounts WHERE user = ?", (user,)
            ).fetchone()
        if row is None:
            raise UnknownAccountError(f"no account {user!r}")
        budget, spent = self._stored(row[0], user), self._stored(row[1], user)
        return Account(user=user, budget=_units(budget), spent=_units(spent))

    def accounts(self) -> list[Account]:
        with self._sqlite_errors():
            query = "SELECT user, budget, spent FROM accounts ORDER BY user"
            rows = self._db.execute(query).fetchall()
        return [
            Account(str(u), _units(self._stored(b, u)), _units(self._stored(s, u)))
            for u, b, s in rows
        ]

    def _stored(self, micros: object, where: object) -> int:
        """A stored amount, checked: SQLite's INTEGER affinity still lets a forged row hold text
        or a real, and nothing in the schema caps it at MAX_AMOUNT."""
        if type(micros) is not int or not 0 <= micros <= _MAX_MICROS:
            raise LedgerCorruptError(
                f"{self.path}: {where!r} holds {micros!r}, not an amount in micro-units "
                f"within [0, {_MAX_MICROS}]"
            )
        return micros

    def balance(self, user: str) -> float:
        """The remaining budget of ``user``."""
        return self.account(user).balance

    # -- charges -------------------------------------------------------------------------------

    def charge(self, batch_id: str, user: str, amount: float) -> Charge:
        """Charge ``user`` ``amount`` for ``batch_id`` (a non-empty string), exactly once.

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
                done_micros = self._stored(done[1], f"journal row {done[0]}")
                if done_micros != micros:
                    raise ChargeConflictError(
                        f"batch {key!r} already charged {user!r} {_units(done_micros)}, "
                        f"not {_units(micros)}"
                    )
                after = self._stored(done[2], f"journal row {done[0]}")
                return Charge(int(done[0]), key, user, _units(done_micros), _units(after))
            query = "SELECT budget, spent FROM accounts WHERE user = ?"
            row = db.execute(query, (user,)).fetchone()
            if row is None:
                raise UnknownAccountError(f"no account {user!r}")
            left = self._stored(row[0], user) - self._stored(row[1], user)
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
        if user is not None:
            _check_user(user)
        query = "SELECT seq, batch_id, user, amount, balance_after FROM journal"
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
                _units(self._stored(a, f"journal row {s}")),
                _units(self._stored(b, f"journal row {s}")),
            )
            for s, k, u, a, b in rows
        ]

    def replay(self) -> dict[str, Account]:
        """Rebuild every account from its budget and the journal, and check them.

        Raises ``LedgerCorruptError`` if a running balance goes negative or disagrees with the
        balance stored in its row, or if the accounts' ``spent`` differs from the journal's sum.
        """
        with self._transaction(write=False) as db:  # one snapshot, whatever others write
            budgets = {
                str(u): (self._stored(b, u), self._stored(s, u))
                for u, b, s in db.execute("SELECT user, budget, spent FROM accounts")
            }
            spent = dict.fromkeys(budgets, 0)
            for seq, user, amount, after in db.execute(
                "SELECT seq, user, amount, balance_after FROM journal ORDER BY seq"
            ):
                if user not in budgets:
                    raise LedgerCorruptError(
                        f"{self.path}: journal row {seq} charges unknown account {user!r}"
                    )
                spent[user] += self._stored(amount, f"journal row {seq}")
                balance = budgets[user][0] - spent[user]
                if balance < 0 or balance != self._stored(after, f"journal row {seq}"):
                    raise LedgerCorruptError(
                        f"{self.path}: journal row {seq}: running balance of {user!r} is "
                        f"{_units(balance)}, row says {_units(int(after))}"
                    )
        for user, (_, recorded) in budgets.items():
            if recorded != spent[user]:
                raise LedgerCorruptError(
                    f"{self.path}: account {user!r} records {_units(recorded)} spent, "
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
    """The key's batch half: a non-empty ``str`` and nothing else (module docstring, "Keys")."""
    if not isinstance(batch_id, str):
        raise ValueError(
            f"batch_id must be a string (convert integer batch numbers yourself, e.g. "
            f"f'batch-{{k}}'), got {type(batch_id).__name__} {batch_id!r}"
        )
    if not batch_id:
        raise ValueError("batch_id must not be empty")
    return batch_id
