"""One request's lifecycle as rules and timestamps, with no I/O (docs/design.md "Data flow (serve
mode)"). The live request path (``cluster/serve/path.py``) and the virtual-time simulator
(``cluster/sim/cluster.py``) both step a :class:`Lifecycle`, so a request is released, placed,
retried, charged and reported by one rule in both::

    queued ─release→ released ─place→ placed ─start→ decoding ─finish→ done
                                 ↑          │ worker_failed, before the first token
                                 └─ retry ──┘ once (MAX_PLACEMENTS = 2); then failed (503)
    any stage before done ─close→ failed | abandoned

Money (§1 "Money"): the auction sells a position, delivered with the first token. The price
quoted at release, ``payment``, is due from the first token on, whatever happens after (a client
that hangs up, a worker that cuts the stream); before it nothing is due and the hold is released
(:attr:`Lifecycle.due`).

Times are seconds on the driver's clock (wall seconds live, virtual seconds in the simulator),
with the symbols the events carry: ``ttft = first_token − arrival``, ``e2e = finished − arrival``
and, where the driver has no per-token samples, ``itl = (e2e − ttft) / max(1, output_tokens − 1)``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Final, Literal

from cluster.events import CompleteEvent, FirstTokenEvent

__all__ = ["MAX_PLACEMENTS", "Lifecycle", "LifecycleError", "Stage"]

Stage = Literal["queued", "released", "placed", "decoding", "done", "failed", "abandoned"]
# One retry before the first token: a worker that fails a request is excluded and the request
# placed once more; a second failure is the client's 503 (a third try would mostly add latency
# to a request whose pool is failing).
MAX_PLACEMENTS: Final = 2


class LifecycleError(RuntimeError):
    """A step out of order: a bug in the driver, never the client's doing."""


@dataclass(eq=False)
class Lifecycle:
    """Everything that happened to one request, set only through the steps below.

    ``payment`` is the price quoted at release (≤ ``bid``), ``batch_id`` the auction batch that
    released it (None: first-come). ``decode_worker``/``prefill_worker`` are the last placement
    (``prefill_worker`` None: prefilled on the decode worker; ``decode_worker`` None: an engine
    instance no slot holds yet). ``excluded`` names, per role, the workers that failed it."""

    request_id: str
    user: str
    arrival: float
    prompt_tokens: int
    output_tokens: int
    bid: float = 0.0
    released: float | None = None
    routed: float | None = None
    decode_worker: int | None = None
    prefill_worker: int | None = None
    first_token: float | None = None
    finished: float | None = None
    cached_tokens: int = 0
    payment: float = 0.0
    batch_id: int | str | None = None
    status: str = "pending"
    placements: int = 0
    excluded: dict[str, list[int]] = field(
        default_factory=lambda: {"prefill": [], "decode": []}, repr=False
    )

    # -- where it stands ---------------------------------------------------------------------

    @property
    def stage(self) -> Stage:
        if self.status in ("failed", "abandoned"):
            return self.status  # type: ignore[return-value]
        if self.finished is not None:
            return "done"
        if self.first_token is not None:
            return "decoding"
        if self.routed is not None:
            return "placed"
        return "queued" if self.released is None else "released"

    @property
    def due(self) -> float:
        """What the books capture: the quoted price once the first token is out, else 0."""
        return self.payment if self.first_token is not None else 0.0

    @property
    def queue_wait(self) -> float | None:
        return None if self.released is None else self.released - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    # -- the steps ---------------------------------------------------------------------------

    def release(self, t: float, payment: float = 0.0, batch_id: int | str | None = None) -> None:
        """Admission let the request go at ``t``, at the quoted ``payment``."""
        self._expect("release", "queued")
        self.released, self.payment, self.batch_id = t, payment, batch_id

    def place(
        self, t: float, decode_worker: int | None, prefill_worker: int | None = None,
        cached_tokens: int = 0,
    ) -> None:  # fmt: skip
        """Routing placed it at ``t`` (again, after a :meth:`worker_failed` that allowed it)."""
        self._expect("place", "released", "placed")
        if self.placements >= MAX_PLACEMENTS:
            raise LifecycleError(f"request {self.request_id!r}: placed {self.placements} times")
        self.placements += 1
        self.routed, self.decode_worker, self.prefill_worker = t, decode_worker, prefill_worker
        self.cached_tokens = cached_tokens

    def worker_failed(self, role: str, worker: int | None) -> bool:
        """A worker failed the request before its first token: exclude it. True: place it once
        more; False: it has had its retry, and has failed (the client's 503)."""
        self._expect("worker_failed", "placed")
        if worker is not None:
            self.excluded.setdefault(role, []).append(worker)
        if self.placements < MAX_PLACEMENTS:
            return True
        self.status = "failed"
        return False

    def start(self, t: float) -> None:
        """The first token came out at ``t``: the position is delivered, its price is due."""
        self._expect("start", "placed")
        self.first_token = t

    def finish(self, t: float) -> None:
        """The last token came out at ``t``."""
        self._expect("finish", "decoding")
        self.finished, self.status = t, "ok"

    def close(self, status: Literal["failed", "abandoned"]) -> None:
        """It ends unanswered: ``failed`` (refused, no worker, cut mid-stream) or ``abandoned``
        (the client left). A request already done or failed keeps its status."""
        if self.stage not in ("done", "failed", "abandoned"):
            self.status = status

    def _expect(self, step: str, *stages: Stage) -> None:
        if self.stage not in stages:
            raise LifecycleError(
                f"request {self.request_id!r}: {step} while {self.stage} (expected "
                f"{' or '.join(stages)})"
            )

    # -- what it reports ---------------------------------------------------------------------

    def first_token_event(self) -> FirstTokenEvent:
        """The ``first_token`` event (a request placed on a decode worker's slot, started)."""
        t = self._require(self.first_token, "first_token_event", "a first token")
        return FirstTokenEvent(
            request_id=self.request_id, t=t, worker_id=self._decode_slot(),
            prefill_worker_id=self._prefill_slot(), ttft_s=t - self.arrival,
        )  # fmt: skip

    def complete_event(self, itl_s: float | None = None) -> CompleteEvent:
        """The ``complete`` event of a finished request; ``itl_s`` the measured mean inter-token
        latency, or None for the mean over the stream's times (module docstring)."""
        t = self._require(self.finished, "complete_event", "a finish")
        ttft = self._require(self.ttft, "complete_event", "a first token")
        e2e = t - self.arrival
        if itl_s is None:
            itl_s = (e2e - ttft) / max(1, self.output_tokens - 1)
        return CompleteEvent(
            request_id=self.request_id, t=t, worker_id=self._decode_slot(),
            prefill_worker_id=self._prefill_slot(), ttft_s=ttft, itl_s=itl_s, e2e_s=e2e,
            prompt_tokens=operator.index(self.prompt_tokens),
            cached_tokens=operator.index(self.cached_tokens),
            output_tokens=operator.index(self.output_tokens), status=self.status,
        )  # fmt: skip

    def _decode_slot(self) -> int:
        if self.decode_worker is None:
            raise LifecycleError(f"request {self.request_id!r}: no decode slot to report")
        return operator.index(self.decode_worker)

    def _prefill_slot(self) -> int | None:
        return None if self.prefill_worker is None else operator.index(self.prefill_worker)

    def _require(self, value: float | None, step: str, what: str) -> float:
        if value is None:
            raise LifecycleError(f"request {self.request_id!r}: {step} without {what}")
        return float(value)
