"""Hypothesis strategies for auction batches: random token trees with chains, stars and ties.

Bids cover the whole range a ``Request`` accepts, [0, ``MAX_BID``] (auction/request.py): small
whole numbers that tie, moderate floats (subnormals included: they are valid bids) and the top of
the range. Comparisons between welfare figures therefore use ``welfare_tol``, which scales with
the batch's bids, never a fixed absolute slack.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st

from auction import Request
from auction.request import MAX_BID

EPS = float(np.finfo(np.float64).eps)  # 2⁻⁵²


def welfare_tol(n: int, bids: npt.ArrayLike) -> float:
    """Absolute tolerance between two welfare figures (or payments, their differences) of one
    batch of n requests: each is built from n sums of up to n non-negative terms bounded by
    Σ_r b_r (subtree sums, then the local terms L_u or Σ_r b_r·x_r), so rounding moves it by
    at most about n²·ε·Σ_r b_r. The factor 4 is margin; the floor of 1 keeps the tolerance
    positive for an all-zero batch."""
    total = float(np.sum(np.asarray(bids, dtype=np.float64)))
    return 4 * max(n, 1) ** 2 * EPS * max(1.0, total)

# Small alphabets make shared prefixes, duplicates and prefix-of-prefix prompts common.
_prompt = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=6)
_bid = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, 3.0]),  # ties
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False, allow_infinity=False),
    st.floats(min_value=0.0, max_value=MAX_BID),  # the whole promised range
    st.just(MAX_BID),
)


@st.composite
def batches(
    draw: st.DrawFn, min_size: int = 0, max_size: int = 12, max_users: int = 4
) -> list[Request]:
    """A batch whose prompts branch from a few shared stems, so trees are deep, wide or both."""
    n = draw(st.integers(min_value=min_size, max_value=max_size))
    stems = draw(st.lists(_prompt, min_size=1, max_size=3))
    users = draw(st.integers(min_value=1, max_value=max_users))
    batch = []
    for k in range(n):
        stem = draw(st.sampled_from(stems))
        tail = draw(st.lists(st.integers(min_value=0, max_value=3), max_size=4))
        batch.append(
            Request(
                id=f"r{k}",
                user=f"u{draw(st.integers(min_value=0, max_value=users - 1))}",
                tokens=stem + tail,
                bid=draw(_bid),
                arrival=draw(st.integers(min_value=0, max_value=5)),
            )
        )
    return batch


def chain(n: int, bids: list[float], users: list[str]) -> list[Request]:
    """Each prompt extends the previous one (an agent trajectory)."""
    return [Request(f"c{k}", users[k], list(range(k + 1)), bids[k], k) for k in range(n)]


def star(n: int, bids: list[float], users: list[str]) -> list[Request]:
    """One shared stem, every request a different continuation."""
    return [Request(f"s{k}", users[k], [9, 9, 9, 100 + k], bids[k], k) for k in range(n)]
