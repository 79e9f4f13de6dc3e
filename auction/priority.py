"""The priority a released request carries into the engines' queues (docs/design.md §1,
"Priority reaches the engine").

An engine serves its waiting requests by (priority, arrival), a lower priority first (vLLM's
priority scheduler; ``cluster/sim/engine_queue.py`` in the simulator). Admission releases
requests in the order the auction sold, so arrival at an engine already follows that order; the
priority only has to keep traffic that bid nothing from standing in front of traffic that bid:

    engine_priority(b_r) = PAYING      if b_r > 0
                           NON_PAYING  if b_r = 0

Two levels, not one per bid: under VCG a request with b_r = 0 adds nothing to welfare wherever
it stands, so moving a bidder ahead of it costs nobody anything and is rightly free; moving one
bidder ahead of another, by contrast, is what the auction prices, and an engine that ordered
bidders by bid would hand out, unpriced, positions the auction did not sell.

The same rule cuts the admission queue into batches (``batch_members``): a batch takes the
oldest paying requests first and fills up with the oldest non-paying ones. Admission releases
only what the engines can start soon, so at saturation the queue is in front of the auction;
cut in plain arrival order, a bidder there would wait behind every non-paying request that
arrived before it, and the engines could reorder only the few already released.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar

__all__ = ["NON_PAYING", "PAYING", "batch_members", "engine_priority", "take_batch"]

T = TypeVar("T")

PAYING: Final = 0
NON_PAYING: Final = 1


def engine_priority(bid: float) -> int:
    """``PAYING`` for a positive bid b_r, ``NON_PAYING`` for b_r = 0 (module docstring).

    >>> engine_priority(0.25), engine_priority(0.0)
    (0, 1)
    """
    return PAYING if bid > 0 else NON_PAYING


def batch_members(bids: Sequence[float], batch_size: int) -> list[int]:
    """The next batch out of a queue whose bids are ``bids`` in arrival order: the indices of
    the oldest ``batch_size`` by (``engine_priority``, arrival), in arrival order.

    >>> batch_members([0.0, 2.0, 0.0, 1.0, 0.0], 3)
    [0, 1, 3]
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    paying = [i for i, b in enumerate(bids) if b > 0][:batch_size]
    if len(paying) < batch_size:
        rest = [i for i, b in enumerate(bids) if not b > 0][: batch_size - len(paying)]
        return sorted(paying + rest)
    return paying


def take_batch(
    queue: Sequence[T], bid: Callable[[T], float], batch_size: int
) -> tuple[list[T], list[T]]:
    """(the next batch, what stays queued) of ``queue`` in arrival order, both in arrival
    order: ``batch_members`` over ``bid`` of each item.

    >>> take_batch(["a", "B", "c", "D"], lambda x: float(x.isupper()), 3)
    (['a', 'B', 'D'], ['c'])
    """
    chosen = set(batch_members([bid(item) for item in queue], batch_size))
    taken = [item for i, item in enumerate(queue) if i in chosen]
    return taken, [item for i, item in enumerate(queue) if i not in chosen]
