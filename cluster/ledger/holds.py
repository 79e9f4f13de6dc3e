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

Owners and expiry. A hold has an ``owner`` (who answers for its request: an ingress replica, by
its lease) and may have an ``expires`` time (Unix seconds), which the owner pushes forward while
it lives (``renew_holds``). A hold whose expiry passed belongs to an owner that stopped renewing
(a replica that died): ``release_expired_holds`` releases it. A hold without an expiry belongs to
the process that reserved it and dies with it: ``release_abandoned_holds``, called when the
service starts, releases those and the expired ones, and nothing else, so a request whose
replica is alive while the auction restarts is still charged when it is answered.

Batches. ``reserve_many`` and ``settle_many`` run many holds' operations in one transaction (one
commit, one fsync): each item's outcome is returned in its place, an error as a value, so one
refused bid does not undo the others.

The methods here run on a backend's connection and transactions (``cluster/ledger/sql.py``:
SQLite in ``cluster.ledger.sqlite``, PostgreSQL in ``cluster.ledger.postgres``);
this module holds the arithmetic of holds and their part of the replay check, and
``cluster/ledger/schema.py`` their tables and triggers.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import ClassVar, cast

from auction.money import (
    BudgetExceeded,
    Charge,
    ChargeConflictError,
    Hold,
    HoldError,
    HoldState,
    LedgerCorruptError,
    LedgerError,
    UnknownAccountError,
    UnknownHoldError,
    check_key,
    check_user,
    to_micros,
    units,
)
from cluster.ledger.sql import Db

HOLD_STATES: tuple[HoldState, ...] = ("open", "captured", "released")
MAX_OWNER_CHARS = 256


def _expiry(when: object) -> float | None:
    """An expiry time: None, or finite Unix seconds as a float."""
    if when is None:
        return None
    if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
        raise ValueError(f"an expiry must be finite Unix seconds or None, got {when!r}")
    return float(when)

_HOLD_COLUMNS = 'hold_id, "user", amount, state, charge_seq, owner, expires'


class HoldBook(ABC):
    """The hold operations of a ledger (``cluster.ledger.book.LedgerBook``, whose backend
    provides the connection)."""

    where: str  # the ledger's location, for messages: a file path or a database URL
    # The column that orders holds as they were reserved: SQLite's rowid, PostgreSQL's seq.
    _hold_order: ClassVar[str] = "rowid"

    @abstractmethod
    def _transaction(self, *, write: bool = True) -> AbstractContextManager[Db]:
        """A write transaction that holds the ledger's write lock (or a read snapshot) …
        COMMIT, the database's errors raised as the ledger's."""

    @abstractmethod
    def _stored(self, micros: object, where: object) -> int:
        """A stored amount, checked to be an int in [0, 10¹⁸] (else ``LedgerCorruptError``)."""

    # -- reading -------------------------------------------------------------------------------

    def _account_micros(self, db: Db, user: str) -> tuple[int, int]:
        """(budget, spent) of ``user`` in micro-units; ``UnknownAccountError`` if none."""
        row = db.execute('SELECT budget, spent FROM accounts WHERE "user" = ?', (user,)).fetchone()
        if row is None:
            raise UnknownAccountError(f"no account {user!r}")
        return self._stored(row[0], user), self._stored(row[1], user)

    def _held_micros(self, db: Db, user: str) -> int:
        """H_i: the sum of ``user``'s open holds."""
        query = "SELECT amount FROM holds WHERE \"user\" = ? AND state = 'open'"
        return sum(self._stored(a, f"hold of {user!r}") for (a,) in db.execute(query, (user,)))

    def _hold(self, row: tuple[object, ...]) -> tuple[Hold, int]:
        """A ``holds`` row as a ``Hold`` and its amount in micro-units, checked."""
        hold_id, user, amount, state, seq, owner, expires = row
        micros = self._stored(amount, f"hold {hold_id!r}")
        if state not in HOLD_STATES or (seq is not None and type(seq) is not int):
            raise LedgerCorruptError(f"{self.where}: hold {hold_id!r} is in state {state!r}")
        if expires is not None and type(expires) is not float:
            raise LedgerCorruptError(f"{self.where}: hold {hold_id!r} expires at {expires!r}")
        hold = Hold(str(hold_id), str(user), units(micros), state, seq, str(owner), expires)
        return hold, micros

    def _find_hold(self, db: Db, hold_id: str) -> tuple[Hold, int]:
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
            clauses.append('"user" = ?')
            args.append(user)
        if state is not None:
            if state not in HOLD_STATES:
                raise ValueError(f"state must be one of {HOLD_STATES}, got {state!r}")
            clauses.append("state = ?")
            args.append(state)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._transaction(write=False) as db:
            query = f"SELECT {_HOLD_COLUMNS} FROM holds{where} ORDER BY {self._hold_order}"
            rows = db.execute(query, args)
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

    def available_all(self) -> dict[str, float]:
        """B_i − S_i − H_i for every account, read in one transaction: two queries whatever
        the number of accounts (a lease carries every user's available budget, and a query per
        user made renewals grow with the users)."""
        with self._transaction(write=False) as db:
            accounts = db.execute('SELECT "user", budget, spent FROM accounts').fetchall()
            open_holds = db.execute(
                "SELECT \"user\", amount FROM holds WHERE state = 'open'"
            ).fetchall()
        held: dict[str, int] = {}
        for user, amount in open_holds:
            held[str(user)] = held.get(str(user), 0) + self._stored(amount, f"hold of {user!r}")
        return {
            str(u): units(self._stored(b, u) - self._stored(sp, u) - held.get(str(u), 0))
            for u, b, sp in accounts
        }

    # -- writing -------------------------------------------------------------------------------

    def reserve(
        self, hold_id: str, user: str, amount: float, *, owner: str = "",
        expires: float | None = None,
    ) -> Hold:  # fmt: skip
        """Reserve ``amount`` of ``user``'s budget under ``hold_id`` for ``owner`` until
        ``expires`` (module docstring).

        Raises ``BudgetExceeded`` (writing nothing) if amount > B_i − S_i − H_i,
        ``UnknownAccountError`` for a user without an account and ``ChargeConflictError`` if
        ``hold_id`` was reserved for another user or amount.
        """
        key, micros, life = self._reserve_args(hold_id, user, amount, owner, expires)
        with self._transaction() as db:
            return self._reserve_in(db, key, user, micros, life)

    def reserve_many(
        self, items: Sequence[tuple[str, str, float]], *, owner: str = "",
        expires: float | None = None,
    ) -> list[Hold | LedgerError]:  # fmt: skip
        """``reserve`` of each (hold_id, user, amount) in one transaction, all for ``owner``
        until ``expires``: a ``Hold`` or the error ``reserve`` would raise, in ``items``' order.
        Bad arguments (a key, a user, an amount) raise ``ValueError`` before anything is
        written."""
        checked = [self._reserve_args(h, u, a, owner, expires) for h, u, a in items]
        out: list[Hold | LedgerError] = []
        with self._transaction() as db:
            for (key, micros, life), (_, user, _) in zip(checked, items, strict=True):
                try:
                    out.append(self._reserve_in(db, key, user, micros, life))
                except (BudgetExceeded, UnknownAccountError, ChargeConflictError) as exc:
                    out.append(exc)
        return out

    @staticmethod
    def _reserve_args(
        hold_id: str, user: str, amount: float, owner: str, expires: float | None
    ) -> tuple[str, int, tuple[str, float | None]]:
        key = check_key(hold_id, "hold_id")
        check_user(user)
        if type(owner) is not str or len(owner) > MAX_OWNER_CHARS:
            raise ValueError(f"owner must be a str of at most {MAX_OWNER_CHARS} characters")
        return key, to_micros(amount), (owner, _expiry(expires))

    def _reserve_in(
        self, db: Db, key: str, user: str, micros: int,
        life: tuple[str, float | None],
    ) -> Hold:  # fmt: skip
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
        owner, expires = life
        db.execute(
            'INSERT INTO holds (hold_id, "user", amount, owner, expires) VALUES (?, ?, ?, ?, ?)',
            (key, user, micros, owner, expires),
        )
        return Hold(key, user, units(micros), "open", None, owner, expires)

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
            return self._capture_in(db, key, batch, micros)

    def _capture_in(self, db: Db, key: str, batch: str, micros: int) -> Charge:
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
        seq = int(
            db.execute(
                'INSERT INTO journal (batch_id, "user", hold_id, amount, balance_after) '
                "VALUES (?, ?, ?, ?, ?) RETURNING seq",
                (batch, hold.user, key, micros, after),
            ).fetchone()[0]
        )
        # Close the hold before raising spent: the trigger checks S_i + H_i <= B_i.
        db.execute(
            "UPDATE holds SET state = 'captured', charge_seq = ? WHERE hold_id = ?", (seq, key)
        )
        db.execute('UPDATE accounts SET spent = spent + ? WHERE "user" = ?', (micros, hold.user))
        return Charge(seq, batch, hold.user, units(micros), units(after), key)

    def _capture_row(self, db: Db, seq: int) -> tuple[Charge, int]:
        row = db.execute(
            'SELECT batch_id, "user", amount, balance_after, hold_id FROM journal WHERE seq = ?',
            (seq,),
        ).fetchone()
        if row is None:  # the foreign key forbids it; a forged file could still hold it
            raise LedgerCorruptError(f"{self.where}: journal row {seq} of a capture is missing")
        micros = self._stored(row[2], f"journal row {seq}")
        after = self._stored(row[3], f"journal row {seq}")
        charge = Charge(seq, str(row[0]), str(row[1]), units(micros), units(after), str(row[4]))
        return charge, micros

    def release(self, hold_id: str) -> Hold:
        """Close an open hold without a charge; a closed hold is returned unchanged."""
        key = check_key(hold_id, "hold_id")
        with self._transaction() as db:
            return self._release_in(db, key)

    def _release_in(self, db: Db, key: str) -> Hold:
        hold, _ = self._find_hold(db, key)
        if hold.state != "open":
            return hold
        db.execute("UPDATE holds SET state = 'released' WHERE hold_id = ?", (key,))
        return replace(hold, state="released")

    def settle_many(
        self, items: Sequence[tuple[str, str | None, float]]
    ) -> list[Charge | Hold | LedgerError]:
        """Close each (hold_id, batch_id, amount) in one transaction: ``capture`` of ``amount``
        for ``batch_id``, or ``release`` when ``batch_id`` is None. Each outcome (a ``Charge``,
        a released ``Hold`` or the error the single call would raise) in ``items``' order."""
        checked = [
            (check_key(h, "hold_id"), None if b is None else check_key(b, "batch_id"), to_micros(a))
            for h, b, a in items
        ]
        out: list[Charge | Hold | LedgerError] = []
        with self._transaction() as db:
            for key, batch, micros in checked:
                try:
                    if batch is None:
                        out.append(self._release_in(db, key))
                    else:
                        out.append(self._capture_in(db, key, batch, micros))
                except (HoldError, ChargeConflictError) as exc:  # UnknownHoldError included
                    out.append(exc)
        return out

    def renew_holds(self, owner: str, expires: float) -> int:
        """Push the expiry of ``owner``'s open holds to ``expires``; how many there are."""
        when = _expiry(expires)
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE holds SET expires = ? WHERE owner = ? AND state = 'open' "
                "AND expires IS NOT NULL",
                (when, owner),
            )
            return cursor.rowcount

    def release_holds_of(self, owner: str) -> int:
        """Release ``owner``'s open holds that have an expiry (its lease ended); how many."""
        with self._transaction() as db:
            return db.execute(
                "UPDATE holds SET state = 'released' WHERE state = 'open' AND owner = ? "
                "AND expires IS NOT NULL",
                (owner,),
            ).rowcount

    def release_expired_holds(self, now: float) -> int:
        """Release the open holds whose expiry is at or before ``now``: their owners stopped
        renewing them (module docstring); how many."""
        with self._transaction() as db:
            return db.execute(
                "UPDATE holds SET state = 'released' WHERE state = 'open' AND expires <= ?",
                (_expiry(now),),
            ).rowcount

    def release_abandoned_holds(self, now: float) -> int:
        """At service start: release the open holds without an expiry (their process is gone)
        and the expired ones; how many. Holds a live owner still renews stay open."""
        with self._transaction() as db:
            return db.execute(
                "UPDATE holds SET state = 'released' WHERE state = 'open' "
                "AND (expires IS NULL OR expires <= ?)",
                (_expiry(now),),
            ).rowcount

    # -- replay --------------------------------------------------------------------------------

    def _replay_holds(
        self,
        db: Db,
        budgets: Mapping[str, int],
        spent: Mapping[str, int],
        captures: Mapping[int, tuple[str, str, int]],
    ) -> None:
        """Check the holds against the replayed journal: every capture row (seq → user, hold_id,
        amount) belongs to its captured hold, user and amount within it, and S_i + H_i ≤ B_i."""
        held = dict.fromkeys(budgets, 0)
        claimed: set[int] = set()
        for row in db.execute(f"SELECT {_HOLD_COLUMNS} FROM holds ORDER BY {self._hold_order}"):
            hold, micros = self._hold(tuple(row))
            if hold.user not in budgets:
                raise LedgerCorruptError(f"{self.where}: hold {hold.hold_id!r} of unknown user")
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
                        f"{self.where}: hold {hold.hold_id!r} is captured by journal row "
                        f"{hold.charge_seq}, which does not match it"
                    )
                claimed.add(cast(int, hold.charge_seq))
        orphans = sorted(set(captures) - claimed)
        if orphans:
            raise LedgerCorruptError(
                f"{self.where}: journal row {orphans[0]} captures a hold that is not captured"
            )
        for user, budget in budgets.items():
            if spent[user] + held[user] > budget:
                raise LedgerCorruptError(
                    f"{self.where}: {user!r} has spent {units(spent[user])} and holds "
                    f"{units(held[user])}, past its budget {units(budget)}"
                )
