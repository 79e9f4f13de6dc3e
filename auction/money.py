"""Money as the ledger counts it: units, bounds, records and refusals (docs/design.md §1, "Ledger").

Money is stored as integer micro-units (10⁻⁶ of the budget's currency): sums are exact, and an
amount is rounded to the nearest micro-unit once, when it enters the ledger (exactly, from the
float's binary value). Budgets and amounts are finite, ≥ 0 and at most ``MAX_AMOUNT`` = 10¹² units:
10¹⁸ micro-units, which SQLite's signed 64-bit INTEGER holds with a factor 9 to spare (it tops out
at 2⁶³ − 1 ≈ 9.2·10¹⁸), so a sum of up to nine full budgets still fits. A budget of 10¹³ (10¹⁹
micro-units) used to overflow the column. ``MAX_AMOUNT`` is a thousand maximal bids
(auction/request.py, ``MAX_BID`` = 10⁹).

Keys are non-empty strings only: an integer id would be stored as its decimal text and so collide
with the string of the same digits (1 and "1" were one key); a caller with integer batch numbers
converts them itself, once, the same way everywhere (e.g. ``f"batch-{k}"``).

The ledgers that keep the books (SQLite, PostgreSQL) are ``cluster/ledger/``; they re-export
these names, and ``auction`` the public ones.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Literal

MICROS: Final = 1_000_000
"""Micro-units per unit of money."""

MAX_AMOUNT: Final = 1e12
"""Largest budget or charge, in units of money (10¹⁸ micro-units; see the module docstring)."""

MAX_MICROS: Final = 10**18

HoldState = Literal["open", "captured", "released"]


class LedgerError(Exception):
    """Base class of the ledger's refusals."""


class BudgetExceeded(LedgerError):  # noqa: N818  (the name the callers were promised)
    """A charge or hold would take an account past its budget; nothing was written.

    ``balance`` is what was still available: budget − spent − open holds.
    """

    def __init__(self, user: str, amount: float, balance: float) -> None:
        super().__init__(
            f"charge of {amount:.6f} to {user!r} exceeds its remaining budget {balance:.6f}"
        )
        self.user, self.amount, self.balance = user, amount, balance

    def __reduce__(self) -> tuple[type[BudgetExceeded], tuple[str, float, float]]:
        # Rebuilt from its fields, not its message: it crosses process boundaries (a Ray actor
        # raises it to the ingress, which answers 402), and pickle re-calls __init__.
        return type(self), (self.user, self.amount, self.balance)


class UnknownAccountError(LedgerError):
    """No account with this user id."""


class ChargeConflictError(LedgerError):
    """A key was already used with different terms: a (batch_id, user) charged another amount, a
    hold captured with another amount or batch, or a hold id reserved for another user or
    amount."""


class HoldError(LedgerError):
    """A hold cannot do what was asked: capture more than it holds, or capture after release."""


class UnknownHoldError(HoldError):
    """No hold with this id."""


class LedgerCorruptError(LedgerError):
    """The file is not a ledger (not SQLite, or not this schema), or replaying its journal does
    not reproduce its accounts and holds."""


@dataclass(frozen=True)
class Account:
    user: str
    budget: float
    spent: float

    @property
    def balance(self) -> float:
        """What is left: budget − spent (never negative; open holds not subtracted)."""
        return self.budget - self.spent


@dataclass(frozen=True)
class Charge:
    """One journal row: the charge of ``user`` for ``batch_id`` and the balance it left.

    ``hold_id`` is the hold it captured, or "" for a plain ``Ledger.charge``.
    """

    seq: int
    batch_id: str
    user: str
    amount: float
    balance_after: float
    hold_id: str = ""


@dataclass(frozen=True)
class Hold:
    """A reservation of ``amount`` on ``user``'s budget; ``charge_seq`` is the journal row of its
    capture (``state == "captured"``), else None. ``owner`` answers for its request and renews
    ``expires`` (Unix seconds; None: released when the service next starts) while it lives."""

    hold_id: str
    user: str
    amount: float
    state: HoldState
    charge_seq: int | None = None
    owner: str = ""
    expires: float | None = None


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


def units(micros: int) -> float:
    """Micro-units back to units of money."""
    return micros / MICROS


def check_user(user: object) -> None:
    if not isinstance(user, str) or not user:
        raise ValueError(f"user must be a non-empty string, got {user!r}")


def check_key(key: object, what: str) -> str:
    """A key (``batch_id``, ``hold_id``): a non-empty ``str``, nothing else (module docstring)."""
    if not isinstance(key, str):
        raise ValueError(
            f"{what} must be a string (convert integer batch numbers yourself, e.g. "
            f"f'batch-{{k}}'), got {type(key).__name__} {key!r}"
        )
    if not key:
        raise ValueError(f"{what} must not be empty")
    return key
