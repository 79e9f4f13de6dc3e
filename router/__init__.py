"""Plain-Python KV-aware router, compatible with Dynamo's (docs/design.md §2).

One module per idea: ``hashing`` (Dynamo's block and sequence hashes), ``events`` (KV events
from plain dicts), ``kv_index`` (which worker caches which prefix), ``load`` (active prefill
tokens / decode blocks / requests per worker), ``cost`` (the cost and the tau-softmax) and
``router`` (``Router.decide`` and its ``Decision``).

>>> router = Router(block_size=4)
>>> router.add_worker(1)
>>> router.add_worker(2)
>>> first = block_hashes([1, 2, 3, 4], block_size=4)[0]
>>> router.apply_event({"worker_id": 2, "data": {"stored": {
...     "parent_hash": None, "blocks": [{"block_hash": 7, "tokens_hash": first}]}}})
True
>>> d = router.decide("req-1", [1, 2, 3, 4, 5])
>>> d.worker, d.overlap_blocks, d.uncached_tokens, d.costs
(2, (0, 1), (5, 1), (1.25, 0.25))
>>> router.complete("req-1")
True
"""

from router.cost import (
    CandidateCost,
    lowest_cost_index,
    prefill_blocks,
    routing_costs,
    sample_index,
    softmax_probabilities,
    uncached_tokens,
)
from router.events import (
    Cleared,
    KvEvent,
    MalformedEventError,
    Removed,
    Stored,
    parse_kv_event,
    to_payload,
)
from router.hashing import (
    DEFAULT_BLOCK_SIZE,
    XXH3_SEED,
    PromptHashes,
    block_hashes,
    next_sequence_hash,
    sequence_hashes,
    token_bytes,
)
from router.kv_index import KvIndex
from router.load import LoadTracker, LoadView, Reservation
from router.router import SELECTIONS, Decision, Override, Policy, Router, Selection

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "SELECTIONS",
    "XXH3_SEED",
    "CandidateCost",
    "Cleared",
    "Decision",
    "KvEvent",
    "KvIndex",
    "LoadTracker",
    "LoadView",
    "MalformedEventError",
    "Override",
    "Policy",
    "PromptHashes",
    "Removed",
    "Reservation",
    "Router",
    "Selection",
    "Stored",
    "block_hashes",
    "lowest_cost_index",
    "next_sequence_hash",
    "parse_kv_event",
    "prefill_blocks",
    "routing_costs",
    "sample_index",
    "sequence_hashes",
    "softmax_probabilities",
    "to_payload",
    "token_bytes",
    "uncached_tokens",
]
