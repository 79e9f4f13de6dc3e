"""``run_auction``: one batch in, an order of service and VCG prices out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from auction.radix import RadixTree, build_radix_tree
from auction.request import Request
from auction.schedulers import get_scheduler
from auction.vcg import vcg_payments
from auction.welfare import welfare, welfare_pct_above_half


@dataclass(frozen=True)
class AuctionResult:
    """The outcome of one batch.

    ``order`` lists request ids, first served first. ``payments`` maps every user in the batch to
    its VCG payment under ``dfs-bid`` and is empty for the other schedulers, which charge nothing.
    ``welfare`` is W(σ) under the bids; ``welfare_pct_above_half`` compares it with a random order.
    """

    scheduler: str
    order: tuple[str, ...]
    payments: Mapping[str, float]
    welfare: float
    welfare_pct_above_half: float
    tree: RadixTree = field(repr=False)

    @property
    def revenue(self) -> float:
        return float(sum(self.payments.values()))


def run_auction(
    requests: Iterable[Request], scheduler: str = "dfs-bid", *, seed: int = 0
) -> AuctionResult:
    """Order a batch with ``scheduler`` and, for ``dfs-bid``, price it with VCG.

    ``seed`` draws the neutral sibling ties of the bid-blind baselines (``dfs-uniform``,
    ``dfs-weight``); the other schedulers' orders do not depend on it.

    Raises ``ValueError`` for an unknown scheduler or duplicate request ids; a ``Request`` already
    rejected bad bids and tokens when it was made.

    >>> r = run_auction([Request("a", "u1", [1, 2], 1.0), Request("b", "u2", [3], 3.0)])
    >>> r.order, r.welfare, r.payments
    (('b', 'a'), 3.0, {'u1': 0.0, 'u2': 1.0})
    """
    policy = get_scheduler(scheduler)
    tree = build_radix_tree(requests)
    bids = np.fromiter((r.bid for r in tree.requests), dtype=np.float64, count=tree.n)
    order = policy.order(tree, bids, seed=seed)
    value = welfare(order, bids)
    payments = vcg_payments(tree, bids) if scheduler == "dfs-bid" else {}
    return AuctionResult(
        scheduler=scheduler,
        order=tuple(tree.requests[int(r)].id for r in order),
        payments=payments,
        welfare=value,
        welfare_pct_above_half=welfare_pct_above_half(value, bids),
        tree=tree,
    )
