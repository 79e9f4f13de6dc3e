"""The auction actor: admission (``auction.admission.AdmissionQueue``) and money
(``cluster.ledger.sqlite.Ledger`` holds) behind async methods (docs/design.md "Serve runtime", §1).

One way in: the ingress replicas hand their queued requests in batches (``exchange``,
``cluster/ray/auction_exchange.py``, which states one request's money, with their first tokens,
settlements and withdrawals), and lease slots to admit locally (``lease``). A replica's holds
are owned by its lease and expire with it. When the actor starts it releases the holds it finds
without an owner that renews them (``Ledger.release_abandoned_holds``: the expired ones, and
any without an expiry that an older version left); a replica's unexpired holds stay open, so
its requests are still charged when they are answered.

Threads: the actor's state lives on its event loop; the ledger (``cluster.ledger.open_ledger``:
a SQLite file, or PostgreSQL on a cluster; one durable commit per write) runs on one dedicated
thread, so a commit never stalls the loop and ledger calls keep their
order (a release queued behind a reserve always sees it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from auction.admission import (
    AdmissionQueue,
    BatchOutcome,
    QueueFull,
    derived_max_in_prefill,
)
from auction.realised import RealisedBatch, RealisedWelfare
from cluster.bus import BusError, EventBus
from cluster.dataplane.admission import ANONYMOUS, LEASE_TTL_S, LeaseBook
from cluster.dataplane.settings import HOLD_GRACE_S
from cluster.events import AuctionEvent
from cluster.ledger import open_ledger
from cluster.ledger.sqlite import BudgetExceeded, UnknownAccountError
from cluster.models import validate_model
from cluster.ray.actor_support import Ready, ready_record
from cluster.ray.auction_exchange import Box, Entry, ReplicaExchange
from cluster.ray.auction_settings import AuctionSettingsModel, UserAccount
from cluster.ray.metrics_export import OWNERS, owned_metrics_text
from cluster.ray.status import AuctionStats, UserBalance
from cluster.sim.wallclock import Clock
from telemetry import metrics

__all__ = [
    "ANONYMOUS",
    "AuctionActor",
    "BudgetExceeded",
    "QueueFull",
    "UnknownAccountError",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class AuctionActor(ReplicaExchange):
    def __init__(
        self,
        *,
        settings: Mapping[str, object],
        ledger: str,
        ledger_schema: str = "disaggctl",
        users: Sequence[Mapping[str, object]],
        nats_url: str | None,
        namespace: str = "disagg",
        speedup: float = 1.0,
        epoch_wall: float | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
        hold_grace_s: float = HOLD_GRACE_S,
        slots_per_prefill_worker: int | None = None,
        prefill_workers: int = 1,
    ) -> None:
        model = validate_model(AuctionSettingsModel, settings, "auction settings")
        for name, value in (("slots_per_prefill_worker", slots_per_prefill_worker or 1),
                            ("prefill_workers", prefill_workers)):  # fmt: skip
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        # max_in_prefill derived (the config leaves it out): what the prefill workers can start
        # soon, following re-splits (set_prefill_workers); fixed when the config gives it.
        self._per_worker = None if model.max_in_prefill is not None else slots_per_prefill_worker
        self.prefill_workers = prefill_workers
        derived = self._derived_slots(prefill_workers)
        self.settings = model.to_settings(derived) if derived else model.to_settings()
        self._instance = uuid.uuid4().hex[:8]  # hold and batch ids stay unique across restarts
        if not (isinstance(hold_grace_s, float | int) and 0 <= hold_grace_s <= 3600):
            raise ValueError(f"hold_grace_s must be in [0, 3600], got {hold_grace_s!r}")
        self.hold_grace_s = float(hold_grace_s)
        self._unreleased: set[str] = set()
        self._in_flight: set[tuple[str, str]] = set()  # (call, replica) waiting on the ledger
        self._leases = LeaseBook(
            max_in_prefill=self.settings.max_in_prefill, ttl_s=lease_ttl_s, prefix=self._instance
        )
        accounts = [validate_model(UserAccount, u, f"users[{k}]") for k, u in enumerate(users)]
        self.namespace = namespace
        self._nats_url = nats_url
        self._queue = AdmissionQueue(self.settings, batch_prefix=f"auction-{self._instance}")
        # Event times on the service's shared virtual clock (epoch_wall and speedup as the
        # engines have them); without an epoch, seconds since this actor started.
        epoch = time.time() if epoch_wall is None else epoch_wall
        self._clock = Clock(speedup, t0=time.monotonic() - (time.time() - epoch))
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="ledger")
        try:
            # Here, not by the composer: a SQLite ledger is on the node this actor runs on.
            self._ledger = self._exec.submit(open_ledger, ledger, schema=ledger_schema).result()
            self.released_at_start = self._exec.submit(
                self._ledger.release_abandoned_holds, time.time()
            ).result()
            self._exec.submit(self._open_accounts, accounts).result()
        except BaseException:
            self._exec.shutdown(wait=False)
            raise
        if self.released_at_start:
            log.warning("released %d holds left open by the last run", self.released_at_start)
        self._entries: dict[str, Entry] = {}
        self._boxes: dict[str, Box] = {}  # by replica (auction_exchange.py)
        self.revenue = 0.0  # money captured by this actor (disagg_auction_revenue_total)
        self.welfare = 0.0  # Σ over batches of W(σ) = Σ_r b_r·x_r (docs/design.md §1)
        # The same on the realised TTFT order, over the batches whose requests all started.
        self.realised = RealisedWelfare()
        self.realised_welfare = 0.0
        self.realised_planned_welfare = 0.0  # the planned welfare of those same batches
        self.user_welfare: dict[str, float] = {}  # Σ over batches of V_i
        self._timer: asyncio.TimerHandle | None = None
        self._bus: EventBus | None = None
        self._bus_up = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        metrics.AUCTION_QUEUE_DEPTH.set(0)

    def _derived_slots(self, prefill_workers: int) -> int | None:
        """max_in_prefill for ``prefill_workers`` (at least 1: a pool emptied by a re-split
        still lets one request through), or None when the config fixes it."""
        if self._per_worker is None:
            return None
        return derived_max_in_prefill(self._per_worker, prefill_workers)

    async def set_prefill_workers(self, count: int) -> int:
        """The prefill pool now has ``count`` workers (a re-split moved one): a derived
        ``max_in_prefill`` follows it. Returns the bound in force."""
        if type(count) is not int or not 0 <= count <= 100_000:
            raise ValueError(f"count must be an int in [0, 100000], got {count!r}")
        self.prefill_workers = count
        derived = self._derived_slots(count)
        if derived is not None and derived != self.settings.max_in_prefill:
            self.settings = dataclasses.replace(self.settings, max_in_prefill=derived)
            self._queue.settings = self.settings
            self._leases.max_in_prefill = derived
            self._queue.set_leased(min(self._queue.leased, derived))
            self._pump()  # more slots may release what waits now
        return self.settings.max_in_prefill

    def _open_accounts(self, users: list[UserAccount]) -> None:
        for user in users:
            if user.name == ANONYMOUS:
                continue
            try:
                budget = self._ledger.account(user.name).budget
            except UnknownAccountError:
                self._ledger.open_account(user.name, user.budget)
                continue
            if budget != user.budget:  # the ledger's budget stands: it is what was charged against
                log.warning(
                    "user %r: the ledger holds budget %s, the users file says %s; keeping the "
                    "ledger's",
                    user.name,
                    budget,
                    user.budget,
                )

    async def _ledger_call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._exec, fn, *args)

    # -- lifecycle -----------------------------------------------------------------------------

    async def ready(self) -> Ready:
        if self._nats_url is not None and self._bus is None:
            self._bus = EventBus(self._nats_url, self.namespace, role="auction", name="auction")
            self._spawn(self._connect(self._bus))
        # It publishes in the background and never waits for NATS (``_connect``): not reported.
        return ready_record("auction", released_at_start=self.released_at_start)

    async def _connect(self, bus: EventBus) -> None:
        # In the background and forever: a NATS outage must never hold up admission.
        while True:
            try:
                await bus.connect()
            except (BusError, OSError, ValueError) as exc:
                log.warning("auction events: cannot connect to NATS (%s); retrying", exc)
                await asyncio.sleep(1.0)
                continue
            self._bus_up = True
            return

    async def shutdown(self) -> None:
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._bus is not None and self._bus_up:
            await self._bus.close()
        self._bus, self._bus_up = None, False
        await self._ledger_call(self._ledger.close)
        self._exec.shutdown(wait=True)

    async def metrics_text(self) -> str:
        return owned_metrics_text(OWNERS["auction"])

    def _pump(self) -> None:
        """Release what the rule allows now; publish new batches; arm the batch-window timer."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        gone = self._leases.expire(loop.time())
        if gone:
            self._lend()
            self._drop_replicas(gone, loop.time())
        again = True
        while again:
            again = False
            for release in self._queue.releasable(loop.time()):
                entry = self._entries.get(release.request_id)
                if entry is None:  # withdrawn as it was released: give the slot back
                    self._queue.slot_freed(release.request_id)
                    again = True
                    continue
                entry.release = release
                self._box(entry.owner, loop.time()).released.append(release)
        for outcome in self._queue.pop_batches():
            self._on_batch(outcome)
        metrics.AUCTION_QUEUE_DEPTH.set(self._queue.depth)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self._queue.next_deadline()
        # An expiry frees slots and a dead replica's holds: it is a deadline of its own.
        expiry = self._leases.next_expiry()
        if expiry is not None:
            deadline = expiry if deadline is None else min(deadline, expiry)
        if deadline is not None:
            self._timer = loop.call_at(max(deadline, loop.time() + 1e-3), self._pump)

    def _on_batch(self, outcome: BatchOutcome) -> None:
        metrics.AUCTION_WELFARE.set(outcome.welfare)
        live = [r for r in outcome.order if r in self._entries]
        self.realised.batch(
            outcome.number,
            live,
            {r: self._entries[r].bid for r in live},
            {r: self._entries[r].arrived for r in live},
            outcome.welfare,
        )
        self.welfare += outcome.welfare
        for user, value in outcome.user_welfare.items():
            self.user_welfare[user] = self.user_welfare.get(user, 0.0) + value
        if self._bus is None or not self._bus_up:
            return
        try:
            event = AuctionEvent(
                batch_id=outcome.number,
                t=max(0.0, self._clock.now()),
                n=len(outcome.order),
                order=outcome.order,
                payments=dict(outcome.payments),
                welfare=outcome.welfare,
            )
        except ValueError as exc:  # e.g. a request id past the event's bounds: skip the event
            log.warning("auction event for %s not published: %s", outcome.batch_id, exc)
            return
        self._spawn(self._bus.publish(event))

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _realised(self, batch: RealisedBatch | None) -> None:
        if batch is not None:
            self.realised_welfare += batch.realised
            self.realised_planned_welfare += batch.planned
            metrics.AUCTION_REALISED_WELFARE.set(batch.realised)

    async def set_regime(self, regime: str) -> None:
        self._queue.set_regime(regime)
        if not self._queue.fcfs:  # the replicas learn it at their next renewal
            self._leases.revoke_all()
            self._lend()
        self._pump()

    async def stats(self) -> AuctionStats:
        def users() -> dict[str, UserBalance]:
            return {
                a.user: UserBalance(a.spent, self._ledger.held(a.user), a.budget)
                for a in self._ledger.accounts()
            }

        return AuctionStats(
            queue_depth=self._queue.depth,
            in_flight=len(self._entries),
            in_prefill=self._queue.in_prefill,
            max_in_prefill=self.settings.max_in_prefill,
            prefill_workers=self.prefill_workers,  # what the bound was derived for
            leases=self._leases.slots(),
            regime=self._queue.regime,
            batches=self._queue.batches,
            revenue=self.revenue,
            welfare=self.welfare,
            realised_welfare=self.realised_welfare,
            realised_planned_welfare=self.realised_planned_welfare,
            user_welfare=dict(self.user_welfare),
            released_at_start=self.released_at_start,
            nats=self._bus_up,
            users=await self._ledger_call(users),
        )
