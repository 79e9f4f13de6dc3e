"""One request as the simulator takes it (``SimCluster.submit``), and a workload's batch turned
into them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from auction import Request
from router import PromptHashes

__all__ = ["SimRequest", "sim_requests"]


@dataclass(frozen=True, eq=False)
class SimRequest:
    """``hashes``: the prompt's router hashes when its maker already has them (they must be the
    tokens' own, ``router.PromptHashes``); used when their block size is the cluster's."""

    request_id: str
    tokens: npt.NDArray[np.uint32]
    output_tokens: int
    user: str = "anonymous"
    bid: float = 0.0
    hashes: PromptHashes | None = None

    def __post_init__(self) -> None:
        if len(self.tokens) == 0:
            raise ValueError(f"request {self.request_id!r}: empty prompt")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: output_tokens must be >= 1")


def sim_requests(requests: Sequence[Request], output_tokens: int) -> list[SimRequest]:
    """Auction requests (a workload's batch) as simulator requests with ``output_tokens`` each,
    in arrival order (the order to submit them in)."""
    ordered = sorted(requests, key=lambda r: r.arrival)
    return [SimRequest(r.id, r.token_array, output_tokens, user=r.user, bid=r.bid) for r in ordered]
