"""How much prompt prefix an order of service lets the engine reuse.

With a prefix cache that holds the previous prompt, serving r after r' recomputes only the tokens of
r past their longest common prefix. A DFS order enters every edge of the radix tree once, so it
recomputes exactly the tree's tokens: its reuse is the batch's shared fraction, the most any order
can reach with such a cache (SGLang's longest-prefix-match argument). Orders that ignore the tree
(bid-sort, arrival order) revisit edges and reuse less.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from auction.radix import RadixTree, lcp_length


def prefix_reuse(tree: RadixTree, order: npt.ArrayLike) -> float:
    """Fraction of prompt tokens served from the previous prompt's prefix under ``order``.

    >>> from auction import Request, build_radix_tree
    >>> t = build_radix_tree([Request("a", "u", [1, 2, 3], 1.0), Request("b", "u", [9], 1.0),
    ...                       Request("c", "u", [1, 2, 4], 1.0)])
    >>> prefix_reuse(t, [0, 2, 1]), prefix_reuse(t, [0, 1, 2])
    (0.2857142857142857, 0.0)
    """
    served = [tree.requests[int(r)].token_array for r in np.asarray(order, dtype=np.int64)]
    total = sum(int(a.shape[0]) for a in served)
    if total == 0:
        return 0.0
    reused = sum(lcp_length(prev, cur) for prev, cur in itertools.pairwise(served))
    return float(reused) / total
