"""Join routing decisions with completions by request id, whatever order they arrive in.

Events come off a bus: out of order, duplicated, or never. The joiner holds whichever half of a
request it saw first until the other arrives (then emits a ``WindowRequest`` for the PoA estimator)
or until it is older than ``ttl_s`` (then it is dropped and counted). Duplicates of a half already
held or already joined are counted and ignored. Failed requests and completions that name another
worker than their decision (a migrated request) are counted and not attributed.

The window request carries the decision that placed the request's prefill (games/poa.py): the
prefill router's when the completion names the prefill worker it chose, the decode router's when
the decode worker prefilled locally or nobody told us how the prefill was routed (the engines
routed it themselves).

    attribution_rate = joined / (joined + completions that expired unjoined + unusable ones)

is the share of settled completions the estimator could use; 1 before any settled.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from games.poa import CandidateLoad, WindowRequest


@dataclass(frozen=True)
class RouteRecord:
    """A routing decision: the chosen decode worker and the router's line for every candidate
    (its uncached tokens, active prefill tokens and decode blocks: the route event's breakdown);
    the prefill router's worker and lines when it chose one."""

    request_id: str
    t: float
    worker: int
    candidates: Mapping[int, CandidateLoad]
    prefill_worker: int | None = None
    prefill_candidates: Mapping[int, CandidateLoad] | None = None


@dataclass(frozen=True)
class CompletionRecord:
    """The completion half: a ``first_token`` event (t its arrival; ttft_s all the estimator
    needs), or a ``complete`` event when that was lost."""

    request_id: str
    t: float
    worker: int
    ttft_s: float
    status: str = "ok"
    prefill_worker: int | None = None  # None: prefilled on the decode worker


class EventJoiner:
    def __init__(self, ttl_s: float = 60.0, remember: int = 100_000) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._routes: OrderedDict[str, RouteRecord] = OrderedDict()
        self._completions: OrderedDict[str, CompletionRecord] = OrderedDict()
        self._done: OrderedDict[str, None] = OrderedDict()  # joined ids, for duplicate detection
        self._remember = remember
        self.counts: Counter[str] = Counter()

    @property
    def pending(self) -> int:
        return len(self._routes) + len(self._completions)

    @property
    def attribution_rate(self) -> float:
        settled = (
            self.counts["joined"]
            + self.counts["expired_completion"]
            + self.counts["failed"]
            + self.counts["worker_mismatch"]
        )
        return 1.0 if settled == 0 else self.counts["joined"] / settled

    def has_completion(self, request_id: str) -> bool:
        """Whether a completion half of ``request_id`` is held or already joined.

        A consumer with two sources of the completion half (a ``first_token`` event, then the
        ``complete`` event) feeds the second only when this is False, so the same request is
        neither counted as a duplicate nor joined twice."""
        return self._seen(request_id) or request_id in self._completions

    def add_route(self, route: RouteRecord) -> WindowRequest | None:
        if self._seen(route.request_id) or route.request_id in self._routes:
            self.counts["duplicate_route"] += 1
            return None
        completion = self._completions.pop(route.request_id, None)
        if completion is None:
            self._routes[route.request_id] = route
            return None
        return self._join(route, completion)

    def add_completion(self, completion: CompletionRecord) -> WindowRequest | None:
        if self._seen(completion.request_id) or completion.request_id in self._completions:
            self.counts["duplicate_completion"] += 1
            return None
        route = self._routes.pop(completion.request_id, None)
        if route is None:
            self._completions[completion.request_id] = completion
            return None
        return self._join(route, completion)

    def expire(self, now: float) -> int:
        """Drop halves older than ``ttl_s``; returns how many were dropped."""
        horizon = now - self.ttl_s
        stale_routes = [k for k, r in self._routes.items() if r.t < horizon]
        stale_completions = [k for k, c in self._completions.items() if c.t < horizon]
        for key in stale_routes:
            del self._routes[key]
        for key in stale_completions:
            del self._completions[key]
        self.counts["expired_route"] += len(stale_routes)
        self.counts["expired_completion"] += len(stale_completions)
        return len(stale_routes) + len(stale_completions)

    def _seen(self, request_id: str) -> bool:
        return request_id in self._done

    def _join(self, route: RouteRecord, completion: CompletionRecord) -> WindowRequest | None:
        self._done[route.request_id] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)
        if completion.status != "ok":
            self.counts["failed"] += 1
            return None
        worker, candidates = route.worker, route.candidates
        if route.prefill_worker is not None and completion.prefill_worker is not None:
            worker, candidates = route.prefill_worker, route.prefill_candidates or {}
            if completion.prefill_worker != worker:  # prefilled elsewhere than routed
                self.counts["worker_mismatch"] += 1
                return None
        if completion.worker != route.worker or worker not in candidates:
            self.counts["worker_mismatch"] += 1
            return None
        self.counts["joined"] += 1
        return WindowRequest(
            request_id=route.request_id,
            worker=worker,
            routed_at=route.t,
            first_token_at=completion.t,
            latency=max(0.0, completion.ttft_s),
            candidates=candidates,
        )
