"""Load per worker: what the caller reports plus what routed, unfinished requests reserve.

The cost model (docs/design.md §2, ``router.cost``) reads two loads per worker: active prefill
tokens and active decode blocks. They come from two places:

- ``report``: the caller's measurement (e.g. Dynamo's ``kv_metrics`` ``active_prefill_tokens``
  / ``active_decode_blocks``), which replaces the previous report;
- ``reserve`` / ``finish_prefill`` / ``release``: the router's own bookkeeping — a decision
  reserves its uncached prompt tokens as prefill load and its prompt blocks as decode load on
  the chosen worker, prefill completion returns the former, request completion the rest.

Each reservation remembers exactly what it added, so releasing gives back the same integers:
no drift however many requests pass. A caller whose reports already count routed requests
should not also reserve them (``Router.decide(..., reserve=False)``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadView:
    """One worker's load as the cost model sees it."""

    active_prefill_tokens: int
    active_decode_blocks: int
    active_requests: int


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one routed request added to its worker's load (prefill part until it finishes)."""

    worker: int
    prefill_tokens: int
    decode_blocks: int


_ZERO = LoadView(0, 0, 0)


def _check_count(name: str, value: int) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


class LoadTracker:
    """Reported + reserved load per worker.

    Totals are kept as columns in ascending worker order (``workers``), so that a decision
    reads every candidate's load without a per-worker lookup.
    """

    def __init__(self) -> None:
        self._reported: dict[int, LoadView] = {}
        # request id -> (worker, prefill tokens still held, decode blocks held, prefilling)
        self._reservations: dict[str, tuple[int, int, int, bool]] = {}
        self._workers: tuple[int, ...] = ()
        self._slot: dict[int, int] = {}
        self.prefill_tokens: list[int] = []  # total active prefill tokens, per slot
        self.decode_blocks: list[int] = []  # total active decode blocks, per slot
        self.requests: list[int] = []  # total active requests, per slot

    # -- workers -----------------------------------------------------------------------------

    @property
    def workers(self) -> tuple[int, ...]:
        """Tracked workers, ascending (the order of the load columns)."""
        return self._workers

    def _rebuild(self) -> None:
        old = {w: self.view(w) for w in self._workers if w in self._reported}
        self._workers = tuple(sorted(self._reported))
        self._slot = {w: i for i, w in enumerate(self._workers)}
        views = [old.get(w, _ZERO) for w in self._workers]
        self.prefill_tokens = [v.active_prefill_tokens for v in views]
        self.decode_blocks = [v.active_decode_blocks for v in views]
        self.requests = [v.active_requests for v in views]

    def add_worker(self, worker: int) -> None:
        """Track ``worker`` with zero load (idempotent)."""
        if worker not in self._reported:
            self._reported[worker] = _ZERO
            self._rebuild()

    def remove_worker(self, worker: int) -> None:
        """Forget ``worker`` and the reservations made on it."""
        self._known(worker)
        for request_id in [r for r, res in self._reservations.items() if res[0] == worker]:
            del self._reservations[request_id]
        del self._reported[worker]
        self._rebuild()

    def _known(self, worker: int) -> int:
        slot = self._slot.get(worker)
        if slot is None:
            raise ValueError(f"unknown worker {worker!r}")
        return slot

    # -- reports -----------------------------------------------------------------------------

    def report(
        self,
        worker: int,
        active_prefill_tokens: int,
        active_decode_blocks: int,
        active_requests: int = 0,
    ) -> None:
        """Replace the caller-measured load of ``worker``."""
        slot = self._known(worker)
        _check_count("active_prefill_tokens", active_prefill_tokens)
        _check_count("active_decode_blocks", active_decode_blocks)
        _check_count("active_requests", active_requests)
        old = self._reported[worker]
        self._reported[worker] = LoadView(
            active_prefill_tokens, active_decode_blocks, active_requests
        )
        self.prefill_tokens[slot] += active_prefill_tokens - old.active_prefill_tokens
        self.decode_blocks[slot] += active_decode_blocks - old.active_decode_blocks
        self.requests[slot] += active_requests - old.active_requests

    def reported(self, worker: int) -> LoadView:
        """The caller-measured part of ``worker``'s load (the last ``report``)."""
        self._known(worker)
        return self._reported[worker]

    def reserved(self, worker: int) -> LoadView:
        """The part of ``worker``'s load that this tracker's own reservations hold."""
        total, measured = self.view(worker), self._reported[worker]
        return LoadView(
            total.active_prefill_tokens - measured.active_prefill_tokens,
            total.active_decode_blocks - measured.active_decode_blocks,
            total.active_requests - measured.active_requests,
        )

    def view(self, worker: int) -> LoadView:
        """Total load of ``worker`` (reported + reserved)."""
        slot = self._known(worker)
        return LoadView(self.prefill_tokens[slot], self.decode_blocks[slot], self.requests[slot])

    # -- reservations ------------------------------------------------------------------------

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._reservations

    def __len__(self) -> int:
        return len(self._reservations)

    def reservation(self, request_id: str) -> Reservation | None:
        """What ``request_id`` still holds, if it is in flight."""
        res = self._reservations.get(request_id)
        return None if res is None else Reservation(*res[:3])

    def reserve(
        self, request_id: str, worker: int, prefill_tokens: int, decode_blocks: int
    ) -> None:
        """Add a routed request's load to ``worker`` until it is released."""
        slot = self._known(worker)
        if request_id in self._reservations:
            raise ValueError(f"request {request_id!r} already holds a reservation")
        # Inline checks: this runs once per routed request.
        if type(prefill_tokens) is not int or prefill_tokens < 0:
            _check_count("prefill_tokens", prefill_tokens)
        if type(decode_blocks) is not int or decode_blocks < 0:
            _check_count("decode_blocks", decode_blocks)
        self._reservations[request_id] = (worker, prefill_tokens, decode_blocks, True)
        self.prefill_tokens[slot] += prefill_tokens
        self.decode_blocks[slot] += decode_blocks
        self.requests[slot] += 1

    def finish_prefill(self, request_id: str) -> bool:
        """Return the request's prefill tokens; False if unknown or already returned."""
        res = self._reservations.get(request_id)
        if res is None or not res[3]:
            return False
        worker, prefill_tokens, decode_blocks, _ = res
        self.prefill_tokens[self._slot[worker]] -= prefill_tokens
        self._reservations[request_id] = (worker, 0, decode_blocks, False)
        return True

    def release(self, request_id: str) -> bool:
        """Return everything the request still holds; False if unknown (e.g. a duplicate)."""
        res = self._reservations.pop(request_id, None)
        if res is None:
            return False
        worker, prefill_tokens, decode_blocks, _ = res
        slot = self._slot[worker]
        self.prefill_tokens[slot] -= prefill_tokens
        self.decode_blocks[slot] -= decode_blocks
        self.requests[slot] -= 1
        return True
