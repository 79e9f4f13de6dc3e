"""The inference auction (docs/design.md §1): radix tree of prompts, DFS schedulers, welfare,
VCG payments.

Public API::

    Request(id, user, tokens, bid, arrival)       one queued request (0 <= bid <= MAX_BID)
    run_auction(requests, scheduler="dfs-bid")    -> AuctionResult(order, payments, welfare, ...)
    run_auction(requests, scheduler, seed=s)      seed: the bid-blind baselines' neutral ties
    schedulers                                    "dfs-bid", "dfs-uniform", "dfs-weight",
                                                  "bid-sort", "no-sort" (SCHEDULERS, get_scheduler)
    welfare(order, bids)                          planned: W = Σ b_r·x_r on the order served
    realised_welfare(bids, ttft_s)                realised: the same on the TTFT ranking (§8)
    vcg_payments(tree, bids)                      fast Clarke-pivot payments, O(M log ν)
    vcg_payments_naive(tree, bids)                the reference: recompute the optimum per user
    prefix_reuse(tree, order)                     prompt tokens an order lets the cache reuse
    PacingBidder(gamma, T)                        budget-pacing autobidder (alpha = 1/(1+mu))
    repeated.simulate(draw_batch, T, pacing)      repeated auctions; autobidder_regret(...)
    pacing_welfare_bound(tree, values, bids)      (1/(n-1))·Σ_u L_u*(v)/κ_u
    Account, Charge, Hold, LedgerError, ...       money's units, records and refusals; the
                                                  books that keep them are cluster/ledger/
    AdmissionQueue(AuctionSettings())             admission (service and simulator): FCFS or
                                                  auctioned batches
    engine_priority(bid)                          the priority a request carries to the engines
"""

from auction import repeated, schedulers
from auction.admission import (
    AdmissionQueue,
    AuctionSettings,
    BatchOutcome,
    QueueFull,
    Release,
    batch_seed,
    prefill_slots_per_worker,
    split_payments,
)
from auction.money import (
    Account,
    BudgetExceeded,
    Charge,
    ChargeConflictError,
    Hold,
    HoldError,
    LedgerCorruptError,
    LedgerError,
    UnknownAccountError,
    UnknownHoldError,
)
from auction.pacing import PacingBidder, PacingStep, capped_alpha
from auction.pacing_bound import pacing_kappa, pacing_welfare_bound
from auction.priority import NON_PAYING, PAYING, engine_priority
from auction.radix import RadixTree, build_radix_tree
from auction.reference import all_dfs_orders, vcg_payments_naive
from auction.regret import Regret, autobidder_regret, best_fixed_alpha, loglog_slope
from auction.repeated import Batch, RepeatedResult, simulate, stationary_source
from auction.request import MAX_BID, Request
from auction.reuse import prefix_reuse
from auction.run import AuctionResult, run_auction
from auction.schedulers import SCHEDULERS, Scheduler, dfs_bid_order, get_scheduler
from auction.vcg import vcg_payments
from auction.welfare import (
    average_ranks,
    local_welfare,
    positions,
    priorities,
    realised_welfare,
    realised_welfare_pct_above_half,
    welfare,
    welfare_pct_above_half,
)

__all__ = [
    "MAX_BID",
    "NON_PAYING",
    "PAYING",
    "SCHEDULERS",
    "Account",
    "AdmissionQueue",
    "AuctionResult",
    "AuctionSettings",
    "Batch",
    "BatchOutcome",
    "BudgetExceeded",
    "Charge",
    "ChargeConflictError",
    "Hold",
    "HoldError",
    "LedgerCorruptError",
    "LedgerError",
    "PacingBidder",
    "PacingStep",
    "QueueFull",
    "RadixTree",
    "Regret",
    "Release",
    "RepeatedResult",
    "Request",
    "Scheduler",
    "UnknownAccountError",
    "UnknownHoldError",
    "all_dfs_orders",
    "autobidder_regret",
    "average_ranks",
    "batch_seed",
    "best_fixed_alpha",
    "build_radix_tree",
    "capped_alpha",
    "dfs_bid_order",
    "engine_priority",
    "get_scheduler",
    "local_welfare",
    "loglog_slope",
    "pacing_kappa",
    "pacing_welfare_bound",
    "positions",
    "prefill_slots_per_worker",
    "prefix_reuse",
    "priorities",
    "realised_welfare",
    "realised_welfare_pct_above_half",
    "repeated",
    "run_auction",
    "schedulers",
    "simulate",
    "split_payments",
    "stationary_source",
    "vcg_payments",
    "vcg_payments_naive",
    "welfare",
    "welfare_pct_above_half",
]
