"""Accounts, charges and the journal's replay, written once for every ledger backend (design §1).

The arithmetic and the guarantees are stated in ``cluster/ledger/sqlite.py`` (budgets B_i, spent
S_i,
the journal) and ``cluster/ledger/holds.py`` (holds H_i, S_i + H_i ≤ B_i). A backend subclasses
``LedgerBook`` with its connection, transactions and schema (``cluster/ledger/sql.py``):
``cluster.ledger.sqlite.Ledger`` keeps the ledger in a SQLite file, ``cluster.ledger.postgres.
PostgresLedger`` in a PostgreSQL schema. Both run these same queries, so both keep one contract.
"""

from __future__ import annotations

import math
import numbers
from abc import abstractmethod
from types import TracebackType
from typing import Self

from auction.money import (
    MAX_MICROS,
    Account,
    BudgetExceeded,
    Charge,
    ChargeConflictError,
    LedgerCorruptError,
    LedgerError,
    check_key,
    check_user,
    to_micros,
    units,
)
from cluster.ledger.holds import HoldBook
from cluster.ledger.sql import Db

__all__ = ["LedgerBook", "check_timeout"]


def check_timeout(timeout: object) -> float:
    """How long a backend waits for its database (its lock, its server): finite seconds > 0.
    Typed float by the callers, but checked: they are not all type-checked."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, numbers.Real)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


class LedgerBook(HoldBook):
    """What every ledger does, over its backend's transactions (module docstring)."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection; the ledger is unusable afterwards."""

    # -- accounts ------------------------------------------------------------------------------

    def open_account(self, user: str, budget: float) -> Account:
        """Create ``user`` with ``budget``; opening it again with the same budget is a no-op."""
        check_user(user)
        micros = to_micros(budget, "budget")
        with self._transaction() as db:
            row = db.execute('SELECT budget FROM accounts WHERE "user" = ?', (user,)).fetchone()
            if row is None:
                db.execute('INSERT INTO accounts ("user", budget) VALUES (?, ?)', (user, micros))
            elif self._stored(row[0], user) != micros:
                raise LedgerError(
                    f"account {user!r} already exists with budget {units(row[0])}, "
                    f"not {units(micros)}"
                )
        return self.account(user)

    def account(self, user: str) -> Account:
        check_user(user)
        with self._transaction(write=False) as db:
            budget, spent = self._account_micros(db, user)
        return Account(user=user, budget=units(budget), spent=units(spent))

    def accounts(self) -> list[Account]:
        with self._transaction(write=False) as db:
            rows = db.execute('SELECT "user", budget, spent FROM accounts ORDER BY "user"')
            found = rows.fetchall()
        return [
            Account(str(u), units(self._stored(b, u)), units(self._stored(s, u)))
            for u, b, s in found
        ]

    def _stored(self, micros: object, where: object) -> int:
        """A stored amount, checked: SQLite's INTEGER affinity still lets a forged row hold text
        or a real, and nothing in either schema caps it at MAX_AMOUNT."""
        if type(micros) is not int or not 0 <= micros <= MAX_MICROS:
            raise LedgerCorruptError(
                f"{self.where}: {where!r} holds {micros!r}, not an amount in micro-units "
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
                "WHERE batch_id = ? AND \"user\" = ? AND hold_id = ''",
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
            seq = int(
                db.execute(
                    'INSERT INTO journal (batch_id, "user", amount, balance_after) '
                    "VALUES (?, ?, ?, ?) RETURNING seq",
                    (key, user, micros, left - micros),
                ).fetchone()[0]
            )
            db.execute('UPDATE accounts SET spent = spent + ? WHERE "user" = ?', (micros, user))
        return Charge(seq, key, user, units(micros), units(left - micros))

    def journal(self, user: str | None = None) -> list[Charge]:
        """The charges and captures in commit order (of one user, or all)."""
        if user is not None:
            check_user(user)
        query = 'SELECT seq, batch_id, "user", amount, balance_after, hold_id FROM journal'
        with self._transaction(write=False) as db:
            rows = (
                db.execute(query + " ORDER BY seq").fetchall()
                if user is None
                else db.execute(query + ' WHERE "user" = ? ORDER BY seq', (user,)).fetchall()
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
                for u, b, s in db.execute('SELECT "user", budget, spent FROM accounts')
            }
            spent = dict.fromkeys(budgets, 0)
            captures = self._replay_journal(db, budgets, spent)
            self._replay_holds(db, {u: b for u, (b, _) in budgets.items()}, spent, captures)
        for user, (_, recorded) in budgets.items():
            if recorded != spent[user]:
                raise LedgerCorruptError(
                    f"{self.where}: account {user!r} records {units(recorded)} spent, "
                    f"its journal sums to {units(spent[user])}"
                )
        return {u: Account(u, units(b), units(spent[u])) for u, (b, _) in budgets.items()}

    def _replay_journal(
        self, db: Db, budgets: dict[str, tuple[int, int]], spent: dict[str, int]
    ) -> dict[int, tuple[str, str, int]]:
        """Add the journal into ``spent``, checking each running balance; the captures, by row."""
        captures: dict[int, tuple[str, str, int]] = {}
        for seq, user, amount, after, hold_id in db.execute(
            'SELECT seq, "user", amount, balance_after, hold_id FROM journal ORDER BY seq'
        ):
            if user not in budgets:
                raise LedgerCorruptError(
                    f"{self.where}: journal row {seq} charges unknown account {user!r}"
                )
            micros = self._stored(amount, f"journal row {seq}")
            spent[user] += micros
            balance = budgets[user][0] - spent[user]
            if balance < 0 or balance != self._stored(after, f"journal row {seq}"):
                raise LedgerCorruptError(
                    f"{self.where}: journal row {seq}: running balance of {user!r} is "
                    f"{units(balance)}, row says {units(int(after))}"
                )
            if hold_id != "":
                captures[int(seq)] = (str(user), str(hold_id), micros)
        return captures

    # -- lifetime ------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
