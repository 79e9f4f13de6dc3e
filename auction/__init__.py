"""The inference auction (DESIGN §1): radix tree of prompts, DFS schedulers, welfare, VCG payments.

Public API::

    Request(id, user, tokens, bid, arrival)       one queued request
    run_auction(requests, scheduler="dfs-bid")    -> AuctionResult(order, payments, welfare, ...)
    schedulers                                    "dfs-bid", "dfs-uniform", "bid-sort", "no-sort"
    vcg_payments(tree, bids)                      fast Clarke-pivot payments, O(M log ν)
    vcg_payments_naive(tree, bids)                the reference: recompute the optimum per user
    prefix_reuse(tree, order)                     prompt tokens an order lets the cache reuse
"""

from auction import schedulers
from auction.radix import RadixTree, build_radix_tree
from auction.reference import all_dfs_orders, vcg_payments_naive
from auction.request import Request
from auction.reuse import prefix_reuse
from auction.run import AuctionResult, run_auction
from auction.schedulers import SCHEDULERS, Scheduler, dfs_bid_order, get_scheduler
from auction.vcg import vcg_payments
from auction.welfare import local_welfare, positions, priorities, welfare, welfare_pct_above_half

__all__ = [
    "SCHEDULERS",
    "AuctionResult",
    "RadixTree",
    "Request",
    "Scheduler",
    "all_dfs_orders",
    "build_radix_tree",
    "dfs_bid_order",
    "get_scheduler",
    "local_welfare",
    "positions",
    "prefix_reuse",
    "priorities",
    "run_auction",
    "schedulers",
    "vcg_payments",
    "vcg_payments_naive",
    "welfare",
    "welfare_pct_above_half",
]
