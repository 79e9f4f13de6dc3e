"""Per-identity admission control at the ingress: how often and how much at once each identity
may ask, before anything is read, tokenized or reserved ([14]; docs/design.md "Security model").

An identity is a user of the users file, or all anonymous traffic together (it has no name to
tell one client from another). Each has

- a token bucket: ``rate`` requests per second refill it up to ``burst``; a request takes one
  token, and one that finds none is answered 429 with ``Retry-After``, the whole seconds until a
  token is back (RFC 9110 §10.2.3);
- a concurrency cap: at most ``concurrency`` requests in flight (admitted, not yet answered to
  the end); one more is answered 429 with ``Retry-After: 1``;
- and anonymous traffic may never hold more than ``1 − paid_reserved_share`` of the replica's
  ``max_ongoing_requests``, so that however much of it arrives, paid users keep that share.

A value of 0 switches a limit off (the laptop default, beside the reserved share). The figures
are the service's: each of the N ingress replicas enforces 1/N of the rates and caps
(``per_replica``), since Ray Serve spreads requests evenly over them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import Field

from cluster.models import StrictModel

__all__ = ["LimitSettings", "Limiter", "Permit", "RateLimited"]


BODY_TIMEOUT_S = 30.0


class LimitSettings(StrictModel):
    """``limits:`` in the service's config (module docstring); 0 = no limit."""

    user_rate: float = Field(default=0.0, ge=0.0, le=1e6)  # requests/s, each user
    user_burst: int = Field(default=0, ge=0, le=1_000_000)  # 0: max(1, ceil(user_rate))
    user_concurrency: int = Field(default=0, ge=0, le=1_000_000)
    anonymous_rate: float = Field(default=0.0, ge=0.0, le=1e6)  # all anonymous traffic
    anonymous_burst: int = Field(default=0, ge=0, le=1_000_000)
    anonymous_concurrency: int = Field(default=0, ge=0, le=1_000_000)
    # The share of each replica's max_ongoing_requests that anonymous traffic never takes.
    paid_reserved_share: float = Field(default=0.1, ge=0.0, lt=1.0)
    # A request's whole body must arrive within this many seconds (else 408). The body is read
    # before the request takes its place under the limits above, so a client that trickles it
    # holds no place, and for no longer than this. 30 s carries a 131,072-token prompt's few
    # MiB over a slow link with room to spare.
    body_timeout_s: float = Field(default=BODY_TIMEOUT_S, gt=0.0, le=600.0)

    def per_replica(self, replicas: int) -> LimitSettings:
        """One of ``replicas`` replicas' part: rates and caps divided, never below one."""
        if replicas <= 1:
            return self

        def part(cap: int) -> int:
            return 0 if cap == 0 else max(1, math.ceil(cap / replicas))

        return self.model_copy(update={
            "user_rate": self.user_rate / replicas, "user_burst": part(self.user_burst),
            "user_concurrency": part(self.user_concurrency),
            "anonymous_rate": self.anonymous_rate / replicas,
            "anonymous_burst": part(self.anonymous_burst),
            "anonymous_concurrency": part(self.anonymous_concurrency),
        })  # fmt: skip


class RateLimited(Exception):  # noqa: N818  (what the edge answers: 429)
    """Refused by a limit: ``retry_after_s`` whole seconds until it would pass."""

    def __init__(self, identity: str, reason: str, retry_after_s: int) -> None:
        super().__init__(f"{identity}: {reason}; retry after {retry_after_s} s")
        self.identity, self.reason, self.retry_after_s = identity, reason, retry_after_s


@dataclass
class _Bucket:
    rate: float
    burst: float
    tokens: float
    at: float

    def take(self, now: float) -> float:
        """Take a token: 0.0, or the seconds until one is back (nothing taken)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass
class _Identity:
    bucket: _Bucket | None
    in_flight: int = 0


@dataclass
class Permit:
    """A request's place under its identity's limits; ``release`` when it is answered (once)."""

    limiter: Limiter
    identity: str
    anonymous: bool
    released: bool = field(default=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.limiter._release(self)


class Limiter:
    """One replica's limits (module docstring); ``max_ongoing`` its Serve concurrency."""

    def __init__(
        self, settings: LimitSettings, *, max_ongoing: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.settings, self.clock = settings, clock
        # At least one: a tiny replica still serves anonymous traffic one at a time.
        self.anonymous_cap = max(1, math.floor(max_ongoing * (1.0 - settings.paid_reserved_share)))
        self._identities: dict[str, _Identity] = {}
        self.anonymous_in_flight = 0
        self.refused: dict[str, int] = {}  # by reason, for the tests and the logs

    def admit(self, identity: str, *, anonymous: bool) -> Permit:
        """A permit, or ``RateLimited`` (nothing taken)."""
        s = self.settings
        cap = s.anonymous_concurrency if anonymous else s.user_concurrency
        state = self._identity(identity, anonymous)
        if cap and state.in_flight >= cap:
            raise self._refuse(identity, "concurrency", f"at most {cap} requests at once", 1)
        if anonymous and self.anonymous_in_flight >= self.anonymous_cap:
            raise self._refuse(identity, "anonymous_share",
                               "anonymous traffic is at its share of this replica", 1)  # fmt: skip
        if state.bucket is not None:
            wait = state.bucket.take(self.clock())
            if wait > 0.0:
                rate = state.bucket.rate
                raise self._refuse(identity, "rate", f"over {rate:g} requests/s", math.ceil(wait))
        state.in_flight += 1
        self.anonymous_in_flight += anonymous
        return Permit(self, identity, anonymous)

    def _identity(self, identity: str, anonymous: bool) -> _Identity:
        state = self._identities.get(identity)
        if state is None:  # users come from the users file, anonymous is one: a bounded set
            s = self.settings
            rate = s.anonymous_rate if anonymous else s.user_rate
            burst = (s.anonymous_burst if anonymous else s.user_burst) or max(1, math.ceil(rate))
            bucket = _Bucket(rate, float(burst), float(burst), self.clock()) if rate else None
            state = self._identities[identity] = _Identity(bucket)
        return state

    def _refuse(self, identity: str, kind: str, reason: str, retry_after_s: int) -> RateLimited:
        self.refused[kind] = self.refused.get(kind, 0) + 1
        return RateLimited(identity, reason, max(1, retry_after_s))

    def _release(self, permit: Permit) -> None:
        self._identities[permit.identity].in_flight -= 1
        self.anonymous_in_flight -= permit.anonymous
