"""Holds: money reserved at admission, captured (in part) when the request is answered.

A hold h of user i reserves a_h of i's budget B_i. With S_i the journal's sum for i (``spent``)
and H_i the sum of i's open holds, the ledger keeps, after every transaction,

    S_i + H_i ≤ B_i

``reserve`` admits a hold only if a_h ≤ B_i − S_i − H_i (else ``BudgetExceeded``, nothing
written): a bid above the remaining budget is refused before it queues. ``capture(h, batch, p)``
with 0 ≤ p ≤ a_h closes the hold and writes p to the journal in one transaction, so S_i grows by
p while H_i shrinks by a_h ≥ p and the invariant holds. The remainder a_h − p is released by the
same act. ``release`` closes a hold without a charge. A hold closes once: open → captured or
open → released, enforced by a trigger as well as here.

Capture key. A capture is a journal row keyed by (batch_id, user, hold_id), with a unique
``hold_id`` among captures: a user with several requests in one batch (one hold each) gets one
row per request, all under the batch's id, while a plain ``Ledger.charge`` keeps its key
(batch_id, user) with ``hold_id = ''``. Both live in the one journal, so the replay check of
running balances covers captures and charges alike.

Exactly once: a second ``capture`` of a captured hold returns the original ``Charge`` if the
amount and batch agree and raises ``ChargeConflictError`` if not; ``release`` of a closed hold is
a no-op returning it; ``reserve`` of an existing hold id with the same user and amount returns
that hold (whatever its state), with another user or amount it is a conflict.

Crash safety: a hold open when the process died belongs to a request that was never answered;
``release_open_holds`` (called by the service when it starts) releases them all.

The methods here run on the ``Ledger``'s SQLite connection and transactions (``auction.ledger``);
this module holds the arithmetic of holds and their part of the replay check, and
``auction/ledger_schema.py`` their tables and triggers.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import cast

from auction.money import (
    BudgetExceeded,
    Charge,
    ChargeConflictError,
    Hold,
    HoldError,
    HoldState,
    LedgerCorruptError,
    UnknownAccountError,
    UnknownHoldError,
    check_key,
    check_user,
    to_micros,
    units,
)

HOLD_STATES: tuple[HoldState, ...] = ("open", "captured", "released")

_HOLD_COLUMNS = "hold_id, user, amount, state, charge_seq"


class HoldBook(ABC):
    """The hold operations of ``auction.ledger.Ledger`` (which provides the connection)."""

    path: Path

    @abstractmethod
    def _transaction(self, *, write: bool = True) -> AbstractContextManager[sqlite3.Connection]:
        """BEGIN IMMEDIATE (or a read snapshot) … COMMIT, SQLite errors as the ledger's."""

    @abstractmethod
    def _stored(self, micros: object, where: object) -> int:
        """A stored amount, checked to be an int in [0, 10¹⁸] (else ``LedgerCorruptError``)."""

    # -- reading -------------------------------------------------------------------------------

    def _account_micros(self, db: sqlite3.Connection, user: str) -> tuple[int, int]:
        """(budget, spent) of ``user`` in micro-units; ``UnknownAccountError`` if none."""
        row = db.execute("SELECT budget, spent FROM accounts WHERE user = ?", (user,)).fetchone()
        if row is None:
            raise UnknownAccountError(f"no account {user!r}")
        return self._stored(row[0], user), self._stored(row[1], user)

    def _held_micros(self, db: sqlite3.Connection, user: str) -> int:
        """H_i: the sum of ``user``'s open holds."""
        query = "SELECT amount FROM holds WHERE user = ? AND state = 'open'"
        return sum(self._stored(a, f"hold of {user!r}") for (a,) in db.execute(query, (user,)))

    def _hold(self, row: tuple[object, ...]) -> tuple[Hold, int]:
        """A ``holds`` row as a ``Hold`` and its amount in micro-units, checked."""
        hold_id, user, amount, state, seq = row
        micros = self._stored(amount, f"hold {hold_id!r}")
        if state not in HOLD_STATES or (seq is not None and type(seq) is not int):
            raise LedgerCorruptError(f"{self.path}: hold {hold_id!r} is in state {state!r}")
        hold = Hold(str(hold_id), str(user), units(micros), state, seq)
        return hold, micros

    def _find_hold(self, db: sqlite3.Connection, hold_id: str) -> tuple[Hold, int]:
        query = f"SELECT {_HOLD_COLUMNS} FROM holds WHERE hold_id = ?"
        row = db.execute(query, (hold_id,)).fetchone()
        if row is None:
            raise UnknownHoldError(f"no hold {hold_id!r}")
        return self._hold(tuple(row))

    def hold(self, hold_id: str) -> Hold:
        key = check_key(hold_id, "hold_id")
        with self._transaction(write=False) as db:
            return self._find_hold(db, key)[0]

    def holds(self, user: str | None = None, *, state: HoldState | None = None) -> list[Hold]:
        """Holds in the order they were reserved (of one user and/or in one state, or all)."""
        clauses, args = [], []
        if user is not None:
            check_user(user)
            clauses.append("user = ?")
            args.append(user)
        if state is not None:
            if state not in HOLD_STATES:
                raise ValueError(f"state must be one of {HOLD_STATES}, got {state!r}")
            clauses.append("state = ?")
            args.append(state)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._transaction(write=False) as db:
            rows = db.execute(f"SELECT {_HOLD_COLUMNS} FROM holds{where} ORDER BY rowid", args)
            return [self._hold(tuple(row))[0] for row in rows]

    def held(self, user: str) -> float:
        """H_i: what ``user``'s open holds reserve."""
        check_user(user)
        with self._transaction(write=False) as db:
            self._account_micros(db, user)  # an unknown user is an error, not 0
            return units(self._held_micros(db, user))

    def available(self, user: str) -> float:
        """B_i − S_i − H_i: the largest hold (or charge) ``user`` can take now."""
        check_user(user)
        with self._transaction(write=False) as db:
            budget, spent = self._account_micros(db, user)
            return units(budget - spent - self._held_micros(db, user))

    # -- writing -------------------------------------------------------------------------------

    def reserve(self, hold_id: str, user: str, amount: float) -> Hold:
        """Reserve ``amount`` of ``user``'s budget under ``hold_id`` (module docstring).

        Raises ``BudgetExceeded`` (writing nothing) if amount > B_i − S_i − H_i,
        ``UnknownAccountError`` for a user without an account and ``ChargeConflictError`` if
        ``hold_id`` was reserved for another user or amount.
        """
        key = check_key(hold_id, "hold_id")
        check_user(user)
        micros = to_micros(amount)
        with self._transaction() as db:
            row = db.execute(f"SELECT {_HOLD_COLUMNS} FROM holds WHERE hold_id = ?", (key,))
            found = row.fetchone()
            if found is not None:
                hold, held = self._hold(tuple(found))
                if hold.user != user or held != micros:
                    raise ChargeConflictError(
                        f"hold {key!r} already reserves {hold.amount} of {hold.user!r}, "
                        f"not {units(micros)} of {user!r}"
                    )
                return hold
            budget, spent = self._account_micros(db, user)
            left = budget - spent - self._held_micros(db, user)
            if micros > left:
                raise BudgetExceeded(user, units(micros), units(left))
            db.execute(
                "INSERT INTO holds (hold_id, user, amount) VALUES (?, ?, ?)", (key, user, micros)
            )
        return Hold(key, user, units(micros), "open")

    def capture(self, hold_id: str, batch_id: str, amount: float) -> Charge:
        """Charge ``amount`` (0 ≤ amount ≤ the hold) for ``batch_id`` and close the hold.

        Returns the journal row. A repeat with the same amount and batch returns the original
        row; with another it raises ``ChargeConflictError``. Raises ``HoldError`` for an amount
        above the hold or a released hold and ``UnknownHoldError`` for an unknown id.
        """
        key = check_key(hold_id, "hold_id")
        batch = check_key(batch_id, "batch_id")
        micros = to_micros(amount)
        with self._transaction() as db:
            hold, held = self._find_hold(db, key)
            if hold.state == "captured":
                assert hold.charge_seq is not None  # the schema's CHECK ties the two
                done, done_micros = self._capture_row(db, hold.charge_seq)
                if done_micros != micros or done.batch_id != batch:
                    raise ChargeConflictError(
                        f"hold {key!r} was already captured: {done.amount} for batch "
                        f"{done.batch_id!r}, not {units(micros)} for {batch!r}"
                    )
                return done
            if hold.state == "released":
                raise HoldError(f"hold {key!r} was released: there is nothing to capture")
            if micros > held:
                raise HoldError(f"capture of {units(micros)} exceeds hold {key!r} of {units(held)}")
            budget, spent = self._account_micros(db, hold.user)
            after = budget - spent - micros  # >= 0: the hold fitted in B_i - S_i when reserved
            cursor = db.execute(
                "INSERT INTO journal (batch_id, user, hold_id, amount, balance_after) "
                "VALUES (?, ?, ?, ?, ?)",
                (batch, hold.user, key, micros, after),
            )
            seq = cursor.lastrowid
            # Close the hold before raising spent: the trigger checks S_i + H_i <= B_i.
            db.execute(
                "UPDATE holds SET state = 'captured', charge_seq = ? WHERE hold_id = ?", (seq, key)
            )
            db.execute("UPDATE accounts SET spent = spent + ? WHERE user = ?", (micros, hold.user))
        assert seq is not None
        return Charge(seq, batch, hold.user, units(micros), units(after), key)

    def _capture_row(self, db: sqlite3.Connection, seq: int) -> tuple[Charge, int]:
        row = db.execute(
            "SELECT batch_id, user, amount, balance_after, hold_id FROM journal WHERE seq = ?",
            (seq,),
        ).fetchone()
        if row is None:  # the foreign key forbids it; a forged file could still hold it
            raise LedgerCorruptError(f"{self.path}: journal row {seq} of a capture is missing")
        micros = self._stored(row[2], f"journal row {seq}")
        after = self._stored(row[3], f"journal row {seq}")
        charge = Charge(seq, str(row[0]), str(row[1]), units(micros), units(after), str(row[4]))
        return charge, micros

    def release(self, hold_id: str) -> Hold:
        """Close an open hold without a charge; a closed hold is returned unchanged."""
        key = check_key(hold_id, "hold_id")
        with self._transaction() as db:
            hold, _ = self._find_hold(db, key)
            if hold.state != "open":
                return hold
            db.execute("UPDATE holds SET state = 'released' WHERE hold_id = ?", (key,))
        return Hold(hold.hold_id, hold.user, hold.amount, "released")

    def release_open_holds(self) -> int:
        """Release every open hold (at service start: their requests were never answered)."""
        with self._transaction() as db:
            return db.execute("UPDATE holds SET state = 'released' WHERE state = 'open'").rowcount

    # -- replay --------------------------------------------------------------------------------

    def _replay_holds(
        self,
        db: sqlite3.Connection,
        budgets: Mapping[str, int],
        spent: Mapping[str, int],
        captures: Mapping[int, tuple[str, str, int]],
    ) -> None:
        """Check the holds against the replayed journal: every capture row (seq → user, hold_id,
        amount) belongs to its captured hold, user and amount within it, and S_i + H_i ≤ B_i."""
        held = dict.fromkeys(budgets, 0)
        claimed: set[int] = set()
        for row in db.execute(f"SELECT {_HOLD_COLUMNS} FROM holds ORDER BY rowid"):
            hold, micros = self._hold(tuple(row))
            if hold.user not in budgets:
                raise LedgerCorruptError(f"{self.path}: hold {hold.hold_id!r} of unknown user")
            if hold.state == "open":
                held[hold.user] += micros
            elif hold.state == "captured":
                capture = captures.get(hold.charge_seq) if hold.charge_seq is not None else None
                if (
                    capture is None
                    or capture[:2] != (hold.user, hold.hold_id)
                    or (capture[2] > micros)
                ):
                    raise LedgerCorruptError(
                        f"{self.path}: hold {hold.hold_id!r} is captured by journal row "
                        f"{hold.charge_seq}, which does not match it"
                    )
                claimed.add(cast(int, hold.charge_seq))
        orphans = sorted(set(captures) - claimed)
        if orphans:
            raise LedgerCorruptError(
                f"{self.path}: journal row {orphans[0]} captures a hold that is not captured"
            )
        for user, budget in budgets.items():
            if spent[user] + held[user] > budget:
                raise LedgerCorruptError(
                    f"{self.path}: {user!r} has spent {units(spent[user])} and holds "
                    f"{units(held[user])}, past its budget {units(budget)}"
                )
