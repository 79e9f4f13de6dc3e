"""A queued request and the checks that guard the auction's input (docs/design.md §1).

Bids are money: b_r ≥ 0 (design §1) and at most ``MAX_BID``. Every bid that enters the auction
(a ``Request``'s, or an array handed to ``vcg_payments``, ``welfare`` or the pacing bound) is
checked against that range, so no sum the auction forms can overflow into ``inf`` or ``nan``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np
import numpy.typing as npt

TokenIds = npt.NDArray[np.uint32]

_MAX_TOKEN = 2**32 - 1

MAX_BID: Final = 1e9
"""Largest bid (per request) the auction accepts, in units of money.

Why 1e9:

- Range. Welfare, the local terms L_u and the VCG payments are built from sums of
  b_r·(n − pos_r), at most n²·MAX_BID. For a batch of 65 536 requests (far more than the
  admission stage forms) that is 65 536²·1e9 ≈ 4.3e18, so every such sum, its prefix sums and
  their differences stay finite with about 290 orders of magnitude to spare below float64's
  1.8e308. A bid of 1e308 (accepted before) made payments ``inf`` or ``nan``.
- Resolution. Money is counted in micro-units (auction/money.py). float64 resolves 1e-6 only
  up to 2³³ ≈ 8.6e9 (the spacing of floats near 1e9 is 1.2e-7), so 1e9 is the largest power of
  ten at which a float bid still carries every micro-unit.
- One maximal bid is a thousandth of the ledger's ``MAX_AMOUNT``: any single bid can be charged.
"""


@dataclass(frozen=True, eq=False)
class Request:
    """One request in an auction batch.

    ``tokens`` may be any sequence of non-negative integer token ids; it is stored as a read-only
    ``uint32`` array (``token_array``), so a request can never change under the tree built on it.
    ``bid`` is b_r, the value of moving the request from the back of the batch to the front: a
    real number in [0, ``MAX_BID``] (``ValueError`` naming the request otherwise);
    ``arrival`` orders ties (earlier first).
    """

    id: str
    user: str
    tokens: Sequence[int] | npt.NDArray[np.integer[Any]]
    bid: float
    arrival: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"request id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.user, str) or not self.user:
            raise ValueError(f"request {self.id!r}: user must be a non-empty string")
        object.__setattr__(self, "bid", _checked_bid(self.id, self.bid))
        if isinstance(self.arrival, bool) or not isinstance(self.arrival, int | np.integer):
            raise ValueError(f"request {self.id!r}: arrival must be an integer: {self.arrival!r}")
        object.__setattr__(self, "arrival", int(self.arrival))
        object.__setattr__(self, "tokens", _checked_tokens(self.id, self.tokens))

    @property
    def token_array(self) -> TokenIds:
        """The prompt as a read-only ``uint32`` array."""
        return cast(TokenIds, self.tokens)

    def __len__(self) -> int:
        return int(self.token_array.shape[0])

    def __repr__(self) -> str:
        return (
            f"Request(id={self.id!r}, user={self.user!r}, tokens=<{len(self)} tokens>, "
            f"bid={self.bid!r}, arrival={self.arrival!r})"
        )


def _checked_bid(request_id: str, bid: object) -> float:
    if isinstance(bid, bool) or not isinstance(bid, int | float | np.integer | np.floating):
        raise ValueError(f"request {request_id!r}: bid must be a number, got {bid!r}")
    try:
        value = float(bid)
    except OverflowError:  # an int past float64's range is past MAX_BID too
        raise ValueError(
            f"request {request_id!r}: bid must be <= MAX_BID = {MAX_BID:g}, got {bid!r}"
        ) from None
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"request {request_id!r}: bid must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"request {request_id!r}: bid must be >= 0, got {value!r}")
    if value > MAX_BID:
        raise ValueError(
            f"request {request_id!r}: bid must be <= MAX_BID = {MAX_BID:g}, got {value!r}"
        )
    return value


def check_bid_array(
    bids: npt.ArrayLike, requests: Sequence[Request] | None = None, what: str = "bids"
) -> npt.NDArray[np.float64]:
    """``bids`` as a flat float64 array, each finite and in [0, ``MAX_BID``].

    With ``requests`` there must be one per request, and an error names the offending request's
    id; without, it names the index. Raises ``ValueError`` naming ``what`` and the bad value, so an
    array built outside a ``Request`` (a pacing bidder's, a caller's) meets the same bound.
    """
    try:
        array = np.asarray(bids, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{what} must be numbers ({exc})") from None
    if requests is not None and array.shape != (len(requests),):
        raise ValueError(f"expected {len(requests)} {what}, got shape {array.shape}")
    if array.ndim != 1:
        raise ValueError(f"{what} must be a flat sequence, got shape {array.shape}")
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(array) & (array >= 0) & (array <= MAX_BID))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        where = f"request {requests[k].id!r}" if requests is not None else f"{what}[{k}]"
        raise ValueError(
            f"{what} must be finite and in [0, MAX_BID = {MAX_BID:g}]: {where} is "
            f"{float(array[k])!r}"
        )
    return array


def _checked_tokens(request_id: str, tokens: object) -> TokenIds:
    try:
        array = np.asarray(tokens)
    except (OverflowError, ValueError, TypeError) as exc:
        raise ValueError(f"request {request_id!r}: tokens are not integer ids ({exc})") from None
    if array.ndim != 1:
        raise ValueError(f"request {request_id!r}: tokens must be a flat sequence of token ids")
    if array.size == 0:
        raise ValueError(f"request {request_id!r}: empty token list")
    if array.dtype.kind not in "iu":
        raise ValueError(
            f"request {request_id!r}: tokens must be integers, got dtype {array.dtype} "
            f"(first element {array[0]!r})"
        )
    if int(array.min()) < 0 or int(array.max()) > _MAX_TOKEN:
        raise ValueError(f"request {request_id!r}: token ids must lie in [0, 2**32)")
    checked = np.ascontiguousarray(array, dtype=np.uint32)
    if checked is array or checked.base is not None:
        checked = checked.copy()  # never alias the caller's buffer: the tree relies on it
    checked.flags.writeable = False
    return checked


def check_batch(requests: Iterable[Request]) -> tuple[Request, ...]:
    """Return the batch as a tuple, or raise ``ValueError`` naming duplicated request ids."""
    batch = tuple(requests)
    for request in batch:
        if not isinstance(request, Request):
            raise ValueError(f"batch items must be auction.Request, got {type(request).__name__}")
    counts = Counter(request.id for request in batch)
    duplicated = sorted(rid for rid, count in counts.items() if count > 1)
    if duplicated:
        raise ValueError(f"duplicate request ids in batch: {', '.join(map(repr, duplicated))}")
    return batch
