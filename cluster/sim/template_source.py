"""The calibration workload as an endless source of simulated requests (docs/design.md §6, the
hardware profiles' ``workload``): shared templates, unique tails, bidders and anonymous
traffic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from cluster.sim.workloads import VOCAB, TokenArray, output_length_range
from cluster.values import pareto_values

if TYPE_CHECKING:
    from cluster.sim.cluster import SimRequest

__all__ = ["TemplateSource"]


class TemplateSource:
    """The calibration workload: ``templates`` shared prefixes of ``template_tokens``, each request
    a template plus a unique tail up to ``input_tokens``, then ``output_tokens`` generated.

    Calling it returns the next ``SimRequest`` (templates drawn uniformly, seeded). With
    ``bidders`` ({user: share of requests}), that share of requests belongs to each bidding user
    and carries a bid of 1 + Pareto(1.5); the rest are ``anonymous`` with bid 0.

    With ``output_range_ratio`` r > 0, each request's output length is drawn uniformly from the
    integers in [L(1 - r), L(1 + r)], L = ``output_tokens`` (the mean stays L), as vLLM's serving
    benchmark draws its random lengths (``--random-range-ratio``): a real answer ends at its
    end-of-sequence token, not at a length shared by every request. The lengths come from a
    stream of their own, so a seed's prompts, users and bids are the same whatever r is.
    """

    def __init__(
        self,
        templates: int = 5,
        template_tokens: int = 64,
        input_tokens: int = 128,
        output_tokens: int = 256,
        *,
        seed: int = 0,
        prefix: str = "req",
        bidders: Mapping[str, float] | None = None,
        output_range_ratio: float = 0.0,
    ) -> None:
        if templates < 1 or not 0 <= template_tokens <= input_tokens or output_tokens < 1:
            raise ValueError(
                "templates >= 1, 0 <= template_tokens <= input_tokens, output_tokens >= 1"
            )
        self._output_range = output_length_range(
            output_tokens, output_range_ratio, name="output_range_ratio"
        )
        self._rng = np.random.default_rng(seed)
        # Lengths from a stream of their own: prompts, users and bids do not depend on r.
        self._lengths = np.random.default_rng([seed, 1])
        self._heads = [self._draw(template_tokens) for _ in range(templates)]
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.prefix = prefix
        self.count = 0
        self._pending_heads: list[int] = []
        self._pending_tails: list[TokenArray] = []
        self._pending_users: list[int] = []
        self._pending_bids: list[float] = []
        self._pending_outputs: list[int] = []
        self._users = ["anonymous", *(bidders or {})]
        shares = [float(v) for v in (bidders or {}).values()]
        if any(v < 0 for v in shares) or sum(shares) > 1:
            raise ValueError("bidder shares must be >= 0 and sum to at most 1")
        self._shares = [1.0 - sum(shares), *shares]

    def _draw(self, length: int) -> TokenArray:
        return self._rng.integers(0, VOCAB, size=length, dtype=np.uint32)

    def _refill(self) -> None:
        # One numpy call per 512 requests: per-request draws dominated the simulator's profile.
        tail = self.input_tokens - self._heads[0].shape[0]
        self._pending_heads = self._rng.integers(len(self._heads), size=512).tolist()
        self._pending_tails = list(self._rng.integers(0, VOCAB, size=(512, tail), dtype=np.uint32))
        self._pending_users = self._rng.choice(len(self._users), size=512, p=self._shares).tolist()
        self._pending_bids = pareto_values(self._rng, 512).tolist()
        low, high = self._output_range
        if high > low:
            self._pending_outputs = self._lengths.integers(low, high + 1, size=512).tolist()

    def __call__(self) -> SimRequest:
        from cluster.sim.cluster import SimRequest

        if not self._pending_heads:
            self._refill()
        head = self._heads[self._pending_heads.pop()]
        user = self._pending_users.pop()
        bid = self._pending_bids.pop()
        output = self._pending_outputs.pop() if self._pending_outputs else self.output_tokens
        self.count += 1
        return SimRequest(
            request_id=f"{self.prefix}-{self.count}",
            tokens=np.concatenate((head, self._pending_tails.pop())),
            output_tokens=output,
            user=self._users[user],
            bid=bid if user else 0.0,
        )
