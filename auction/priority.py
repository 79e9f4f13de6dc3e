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
"""

from __future__ import annotations

from typing import Final

__all__ = ["NON_PAYING", "PAYING", "engine_priority"]

PAYING: Final = 0
NON_PAYING: Final = 1


def engine_priority(bid: float) -> int:
    """``PAYING`` for a positive bid b_r, ``NON_PAYING`` for b_r = 0 (module docstring).

    >>> engine_priority(0.25), engine_priority(0.0)
    (0, 1)
    """
    return PAYING if bid > 0 else NON_PAYING
