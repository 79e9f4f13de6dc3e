"""A queued request and the checks that guard the auction's input."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

TokenIds = npt.NDArray[np.uint32]

_MAX_TOKEN = 2**32 - 1


@dataclass(frozen=True, eq=False)
class Request:
    """One request in an auction batch.

    ``tokens`` may be any sequence of non-negative integer token ids; it is stored as a read-only
    ``uint32`` array (``token_array``), so a request can never change under the tree built on it.
    ``bid`` is b_r, the value of moving the request from the back of the batch to the front;
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
    value = float(bid)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"request {request_id!r}: bid must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"request {request_id!r}: bid must be >= 0, got {value!r}")
    return value


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
