"""A simulated disaggregated cluster: prefill and decode pools behind the KV-aware router.

A request goes through the admission stage (FCFS pass-through, or auctioned batches), then the
decode router (``router.Router``, the policy the controller tunes) picks its decode worker. If that
worker already caches all but a few of the prompt's tokens it prefills them itself; otherwise a
prefill worker (picked by a second KV-aware router over the prefill pool) computes the prompt, and
its KV crosses the link (bytes per token · tokens the decode worker lacks / bandwidth) before the
decode worker admits the sequence. The first token comes out of the decode worker's first
iteration; the rest stream one per iteration.

Routing runs on R router replicas (``cluster.sim.views``: each its own index and load view, fed
through the bus late; one replica with a fresh view by default) and the policy (τ, ω) applies to
every router of every replica. The pools can be re-split while serving (``cluster.sim.pools``).

Workers publish Dynamo-shaped KV events into their pool's routers, exactly as real workers would
over NATS; ``kv_listeners`` see the same stream (for the bus), ``first_token_listeners`` see every
request the moment its first token comes out (for the PoA window), ``completion_listeners`` see
every finished request (for load generators and the controller), ``pool_listeners`` every step
of a re-split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from auction import engine_priority
from cluster.sim.admission import Admission, FcfsAdmission
from cluster.sim.decode import DecodeSeq, DecodeWorker
from cluster.sim.loop import EventLoop
from cluster.sim.pools import PoolChange, PoolManager, Topology
from cluster.sim.prefill import PrefillJob, PrefillWorker
from cluster.sim.profile import HardwareProfile
from cluster.sim.records import RequestRecord
from cluster.sim.request import SimRequest, sim_requests
from cluster.sim.views import Role, RouterReplica, RouterViews, ViewSettings
from router import (
    Cleared,
    KvEvent,
    Policy,
    Router,
    Selection,
    block_hashes,
    sequence_hashes,
    to_payload,
)
from telemetry import metrics

__all__ = [
    "PoolChange",
    "SimCluster",
    "SimRequest",
    "Topology",
    "ViewSettings",
    "sim_requests",
]

# Worker w's jitter seed is seed·7919 + w (the wall-time engines replay it); each restart in a
# new role adds this stride, so a re-split worker draws a stream of its own.
_RESTART_SEED_STRIDE = 1_000_003


@dataclass(eq=False)
class _InFlight:
    request: SimRequest
    record: RequestRecord
    local_hashes: list[int]
    seq_hashes: list[int]


class SimCluster:
    def __init__(
        self,
        profile: HardwareProfile,
        topology: Topology | str,
        *,
        seed: int = 0,
        loop: EventLoop | None = None,
        admission: Admission | None = None,
        policy: Policy | None = None,
        views: ViewSettings | None = None,
        priority: Callable[[float], int] = engine_priority,
        selection: Selection = "cost",
    ) -> None:
        """``priority`` maps a request's bid to its place in the engines' queues (lower first;
        ``auction.engine_priority``); a constant makes them first-come, as engines without
        priority scheduling are. ``selection``: how every router picks (``router.Selection``:
        by the policy's cost, or round robin)."""
        self.profile = profile
        self.priority = priority
        self.topology = topology if isinstance(topology, Topology) else Topology.parse(topology)
        self.loop = loop if loop is not None else EventLoop()
        bs = profile.block_size
        self.block_size = bs
        self.seed = seed
        self.views = RouterViews(views or ViewSettings(), self.loop, bs, policy, seed, selection)
        self.kv_listeners: list[Callable[[dict[str, object]], None]] = []
        self.first_token_listeners: list[Callable[[RequestRecord], None]] = []
        self.completion_listeners: list[Callable[[RequestRecord], None]] = []
        self.prefill: dict[int, PrefillWorker] = {}
        self.decode: dict[int, DecodeWorker] = {}
        # Prefill workers take ids 0..P-1, decode workers P..P+D-1; an id stays with its worker
        # (one TP group) when it changes role.
        n_prefill = self.topology.prefill
        roles: dict[int, Role] = {
            w: "prefill" if w < n_prefill else "decode"
            for w in range(n_prefill + self.topology.decode)
        }
        for wid, role in roles.items():
            self.start_worker(wid, role, 0)
            self.views.add_worker(role, wid)
        self.pool_state = PoolManager(self, self.views, self.loop, profile.role_switch_s, roles)
        self._busy: set[int] = set()
        self._inflight: dict[str, _InFlight] = {}
        self.records: list[RequestRecord] = []
        self.admission = admission if admission is not None else FcfsAdmission()
        self.admission.attach(self)
        self._link_bytes_per_s = profile.link.bandwidth_gbps * 1e9 / 8

    # -- routers and policy ------------------------------------------------------------------

    @property
    def routers(self) -> tuple[RouterReplica, ...]:
        """Every router replica (each a decode and a prefill router)."""
        return self.views.replicas

    @property
    def decode_router(self) -> Router:
        """Replica 0's decode router (the only one by default)."""
        return self.views.replicas[0].decode

    @property
    def prefill_router(self) -> Router:
        """Replica 0's prefill router (the only one by default)."""
        return self.views.replicas[0].prefill

    @property
    def policy(self) -> Policy:
        return self.decode_router.policy

    def set_policy(self, policy: Policy) -> None:
        """The controller's policy: every decode and prefill router of every replica, at once."""
        self.views.set_policy(policy)

    # -- pools -------------------------------------------------------------------------------

    @property
    def pools(self) -> Topology:
        """Workers serving in each role now (one draining or warming up counts in neither)."""
        return self.pool_state.pools

    @property
    def resplitting(self) -> bool:
        """A re-split is in progress (its worker drains or warms up)."""
        return self.pool_state.resplitting

    @property
    def pool_listeners(self) -> list[Callable[[PoolChange], None]]:
        return self.pool_state.listeners

    def resplit(self, to_role: Role, reason: str = "", workers: int = 1) -> int:
        """Move ``workers`` from the other role to ``to_role`` at once (drain, restart, warm up:
        see ``cluster.sim.pools``); returns the first one's id. ``ValueError`` if it cannot
        start now."""
        return self.pool_state.resplit(to_role, reason, workers)

    def start_worker(self, worker: int, role: Role, incarnation: int) -> None:
        """A fresh engine of ``role`` (called by the pools; incarnation 0 at construction)."""
        seed = self.seed * 7919 + worker + _RESTART_SEED_STRIDE * incarnation
        if role == "prefill":
            self.prefill[worker] = PrefillWorker(
                worker, self.profile.prefill, self.block_size, seed=seed, sink=self._prefill_sink
            )
        else:
            self.decode[worker] = DecodeWorker(
                worker,
                self.profile.decode,
                self.block_size,
                seed=seed,
                sink=self._decode_sink,
                attention_s_per_token_pair=self.profile.prefill.e_s_per_token_pair,
            )

    def stop_worker(self, worker: int, role: Role) -> None:
        """A drained worker's engine stops; its KV cache goes with it (``cleared`` on the bus:
        its routers forgot it when it left the pool)."""
        del (self.prefill if role == "prefill" else self.decode)[worker]
        self._publish(Cleared(worker))

    # -- requests ----------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.loop.now

    def submit(self, request: SimRequest) -> RequestRecord:
        """A request arrives now; it is admitted, routed and served as the loop runs."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[SimRequest]) -> list[RequestRecord]:
        """Requests that arrive together: all are queued before admission looks at the queue
        (a saturated queue is auctioned in full batches, not one request at a time)."""
        records = [self._register(request) for request in requests]
        self.admission.on_progress(self.now)
        return records

    def _register(self, request: SimRequest) -> RequestRecord:
        if request.request_id in self._inflight:
            raise ValueError(f"request {request.request_id!r} is already in flight")
        made = request.hashes
        if made is not None and made.block_size == self.block_size:
            local, seq = made.local, made.seq
        else:
            local = block_hashes(request.tokens, self.block_size)
            seq = sequence_hashes(local)
        record = RequestRecord(
            request_id=request.request_id,
            user=request.user,
            arrival=self.now,
            prompt_tokens=len(request.tokens),
            output_tokens=request.output_tokens,
            bid=request.bid,
        )
        self.records.append(record)
        self._inflight[request.request_id] = _InFlight(request, record, local, seq)
        self._note("arrive", request.request_id)
        self.admission.enqueue(request)
        return record

    def _note(self, what: str, request_id: str, where: int | None = None) -> None:
        if self.loop.log is not None:
            self.loop.note(f"{what} {request_id}" + ("" if where is None else f" @{where}"))

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet finished."""
        return len(self._inflight)

    @property
    def backlog(self) -> int:
        """Requests routed but not yet started by any worker (what admission throttles on)."""
        return sum(len(p.waiting) for p in self.prefill.values()) + sum(
            len(d.pending) for d in self.decode.values()
        )

    def start_wait(self) -> float:
        """How long a routed request waits, at worst, before a worker starts it: the longest
        wait so far of a request no worker has started, or the rest of a prefill iteration in
        progress (what a request routed now waits for), whichever is longer; 0 when idle."""
        now = self.now
        since = [job.enqueued_at for p in self.prefill.values() for job in p.waiting]
        since += [seq.arrived_at for d in self.decode.values() for seq in d.pending]
        busy = [p.busy_until - now for p in self.prefill.values()]
        return max([0.0, *(now - t for t in since), *busy])

    def release(
        self, request: SimRequest, batch_id: int | None = None, payment: float = 0.0
    ) -> None:
        """Called by the admission stage: the request leaves the queue and is routed now."""
        flight = self._inflight[request.request_id]
        rec = flight.record
        rec.release(self.now, payment, batch_id)
        decision = self.views.route(
            "decode", request.request_id, request.tokens, flight.local_hashes
        )
        rec.decision = decision
        self.pool_state.hold(decision.worker)
        metrics.ROUTING_COST.set(decision.chosen.cost)
        self._note("route", request.request_id, decision.worker)
        worker = self.decode[decision.worker]
        prompt = rec.prompt_tokens
        uncached = worker.uncached_tokens(flight.seq_hashes, prompt)
        serving_prefill = self.views.workers("prefill")
        if not serving_prefill or uncached <= self.profile.decode.local_prefill_max_tokens:
            rec.place(self.now, decision.worker)
            self._to_decode(flight, prefill_locally=True)
            return
        pick = self.views.route("prefill", request.request_id, request.tokens, flight.local_hashes)
        rec.place(self.now, decision.worker, pick.worker)
        rec.prefill_decision = pick
        self.pool_state.hold(pick.worker)
        job = PrefillJob(
            request.request_id, prompt, flight.local_hashes, flight.seq_hashes,
            priority=self.priority(request.bid),
        )  # fmt: skip
        self.prefill[pick.worker].submit(job, self.now)
        self._kick_prefill(pick.worker)

    # -- prefill -----------------------------------------------------------------------------

    def _kick_prefill(self, wid: int) -> None:
        if wid in self._busy:
            return
        duration = self.prefill[wid].start_iteration(self.now)
        if duration is not None:
            self._busy.add(wid)
            self.loop.after(duration, self._prefill_done, wid)

    def _prefill_done(self, wid: int) -> None:
        self._busy.discard(wid)
        for job in self.prefill[wid].finish_iteration(self.now):
            flight = self._inflight[job.request_id]
            rec = flight.record
            rec.prefill_start, rec.prefill_end = job.started_at, job.finished_at
            rec.cached_tokens = job.cached_tokens
            self.views.complete("prefill", job.request_id)
            self.views.finish_prefill("decode", job.request_id)
            decode = self.decode[rec.decode_worker]  # type: ignore[index]
            missing = decode.uncached_tokens(flight.seq_hashes, rec.prompt_tokens)
            transfer = self.profile.link.latency_s + (
                missing * self.profile.kv_bytes_per_token / self._link_bytes_per_s
            )
            self.loop.after(transfer, self._transferred, flight)
        self._kick_prefill(wid)
        self.admission.on_progress(self.now)

    def _transferred(self, flight: _InFlight) -> None:
        rec = flight.record
        rec.transfer_end = self.now
        self._to_decode(flight, prefill_locally=False)
        # The KV has left the prefill worker: only now may a draining one stop.
        assert rec.prefill_worker is not None
        self.pool_state.let_go(rec.prefill_worker)

    # -- decode ------------------------------------------------------------------------------

    def _to_decode(self, flight: _InFlight, prefill_locally: bool) -> None:
        rec = flight.record
        seq = DecodeSeq(
            rec.request_id,
            rec.prompt_tokens,
            rec.output_tokens,
            flight.local_hashes,
            flight.seq_hashes,
            prefill_locally=prefill_locally,
            priority=self.priority(rec.bid),
        )
        wid = rec.decode_worker
        assert wid is not None
        self.decode[wid].submit(seq, self.now)
        self._kick_decode(wid)

    def _kick_decode(self, wid: int) -> None:
        if wid in self._busy:
            return
        duration = self.decode[wid].start_iteration(self.now)
        if duration is not None:
            self._busy.add(wid)
            self.loop.after(duration, self._decode_done, wid)

    def _decode_done(self, wid: int) -> None:
        self._busy.discard(wid)
        worker = self.decode[wid]
        first, done = worker.finish_iteration(self.now)
        for seq in first:
            rec = self._inflight[seq.request_id].record
            rec.start(self.now)
            self._note("first-token", seq.request_id, wid)
            if seq.prefill_locally:
                # Local prefill ran inside this iteration, on what the cache held at admission.
                rec.cached_tokens = seq.prompt_tokens - seq.local_prefill_tokens
                rec.prefill_start = rec.prefill_end = rec.transfer_end = self.now
                self.views.finish_prefill("decode", seq.request_id)
            for listener in self.first_token_listeners:
                listener(rec)
        for seq in done:
            flight = self._inflight.pop(seq.request_id)
            rec = flight.record
            rec.finish(self.now)
            self._note("done", seq.request_id, wid)
            rec.itl = worker.itl_samples(seq)
            self.views.complete("decode", seq.request_id)
            for listener in self.completion_listeners:
                listener(rec)
        self._kick_decode(wid)
        for _ in done:  # after the kick: a drained worker is idle, so it may stop now
            self.pool_state.let_go(wid)
        if first:
            self.admission.on_progress(self.now)

    # -- KV events ---------------------------------------------------------------------------

    def _prefill_sink(self, event: KvEvent) -> None:
        self.views.publish("prefill", event)
        self._publish(event)

    def _decode_sink(self, event: KvEvent) -> None:
        self.views.publish("decode", event)
        self._publish(event)

    def _publish(self, event: KvEvent) -> None:
        if self.kv_listeners:
            payload = to_payload(event)
            for listener in self.kv_listeners:
                listener(payload)
