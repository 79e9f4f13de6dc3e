"""A simulated disaggregated cluster: prefill and decode pools behind the KV-aware router.

A request goes through the admission stage (FCFS pass-through, or auctioned batches), then the
decode router (``router.Router``, the policy the controller tunes) picks its decode worker. If that
worker already caches all but a few of the prompt's tokens it prefills them itself; otherwise a
prefill worker (picked by a second KV-aware router over the prefill pool) computes the prompt, and
its KV crosses the link (bytes per token · tokens the decode worker lacks / bandwidth) before the
decode worker admits the sequence. The first token comes out of the decode worker's first
iteration; the rest stream one per iteration.

Workers publish Dynamo-shaped KV events into their pool's router, exactly as real workers would
over NATS; ``kv_listeners`` see the same stream (for the bus), ``first_token_listeners`` see every
request the moment its first token comes out (for the PoA window), ``completion_listeners`` see
every finished request (for load generators and the controller).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from auction import Request
from cluster.sim.admission import Admission, FcfsAdmission
from cluster.sim.decode import DecodeSeq, DecodeWorker
from cluster.sim.loop import EventLoop
from cluster.sim.prefill import PrefillJob, PrefillWorker
from cluster.sim.profile import HardwareProfile
from cluster.sim.records import RequestRecord
from controller import metrics
from router import KvEvent, Policy, Router, block_hashes, sequence_hashes, to_payload


@dataclass(frozen=True)
class Topology:
    """``prefill`` prefill workers and ``decode`` decode workers, each of ``tp`` GPUs."""

    prefill: int
    decode: int

    def __post_init__(self) -> None:
        if self.prefill < 0 or self.decode < 1:
            raise ValueError(f"a topology needs >= 0 prefill and >= 1 decode workers: {self}")

    @classmethod
    def parse(cls, text: str) -> Topology:
        """``"1P/5D"`` → Topology(1, 5)."""
        match = re.fullmatch(r"\s*(\d+)\s*P\s*/\s*(\d+)\s*D\s*", text, re.IGNORECASE)
        if not match:
            raise ValueError(f"bad topology {text!r}: expected xP/yD, e.g. 1P/5D")
        return cls(int(match[1]), int(match[2]))

    def __str__(self) -> str:
        return f"{self.prefill}P/{self.decode}D"

    def gpus(self, tp: int) -> int:
        return (self.prefill + self.decode) * tp


@dataclass(frozen=True, eq=False)
class SimRequest:
    request_id: str
    tokens: npt.NDArray[np.uint32]
    output_tokens: int
    user: str = "anonymous"
    bid: float = 0.0

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
    ) -> None:
        self.profile = profile
        self.topology = topology if isinstance(topology, Topology) else Topology.parse(topology)
        self.loop = loop if loop is not None else EventLoop()
        bs = profile.block_size
        self.block_size = bs
        self.decode_router = Router(bs, policy, seed=seed)
        self.prefill_router = Router(bs, Policy(0.0, 1.0), seed=seed + 1)
        self.kv_listeners: list[Callable[[dict[str, Any]], None]] = []
        self.first_token_listeners: list[Callable[[RequestRecord], None]] = []
        self.completion_listeners: list[Callable[[RequestRecord], None]] = []
        self.prefill: dict[int, PrefillWorker] = {}
        self.decode: dict[int, DecodeWorker] = {}
        for p in range(self.topology.prefill):
            self.prefill[p] = PrefillWorker(
                p, profile.prefill, bs, seed=seed * 7919 + p, sink=self._prefill_sink
            )
            self.prefill_router.add_worker(p)
        for d in range(self.topology.decode):
            wid = self.topology.prefill + d
            self.decode[wid] = DecodeWorker(
                wid, profile.decode, bs, seed=seed * 7919 + wid, sink=self._decode_sink
            )
            self.decode_router.add_worker(wid)
        self._busy: set[int] = set()
        self._inflight: dict[str, _InFlight] = {}
        self.records: list[RequestRecord] = []
        self.admission = admission if admission is not None else FcfsAdmission()
        self.admission.attach(self)
        self._link_bytes_per_s = profile.link.bandwidth_gbps * 1e9 / 8

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
        local = block_hashes(request.tokens, self.block_size)
        record = RequestRecord(
            request_id=request.request_id,
            user=request.user,
            arrival=self.now,
            prompt_tokens=len(request.tokens),
            output_tokens=request.output_tokens,
            bid=request.bid,
        )
        self.records.append(record)
        self._inflight[request.request_id] = _InFlight(
            request, record, local, sequence_hashes(local)
        )
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

    def release(
        self, request: SimRequest, batch_id: int | None = None, payment: float = 0.0
    ) -> None:
        """Called by the admission stage: the request leaves the queue and is routed now."""
        flight = self._inflight[request.request_id]
        rec = flight.record
        rec.released, rec.batch_id, rec.payment = self.now, batch_id, payment
        decision = self.decode_router.decide(
            request.request_id, request.tokens, local_hashes=flight.local_hashes
        )
        rec.decision, rec.routed, rec.decode_worker = decision, self.now, decision.worker
        metrics.ROUTING_COST.set(decision.chosen.cost)
        self._note("route", request.request_id, decision.worker)
        worker = self.decode[decision.worker]
        prompt = rec.prompt_tokens
        uncached = worker.uncached_tokens(flight.seq_hashes, prompt)
        if not self.prefill or uncached <= self.profile.decode.local_prefill_max_tokens:
            self._to_decode(flight, prefill_locally=True)
            return
        pick = self.prefill_router.decide(
            request.request_id, request.tokens, local_hashes=flight.local_hashes
        )
        rec.prefill_worker = pick.worker
        job = PrefillJob(request.request_id, prompt, flight.local_hashes, flight.seq_hashes)
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
            self.prefill_router.complete(job.request_id)
            self.decode_router.finish_prefill(job.request_id)
            decode = self.decode[rec.decode_worker]  # type: ignore[index]
            missing = decode.uncached_tokens(flight.seq_hashes, rec.prompt_tokens)
            transfer = self.profile.link.latency_s + (
                missing * self.profile.kv_bytes_per_token / self._link_bytes_per_s
            )
            self.loop.after(transfer, self._transferred, flight)
        self._kick_prefill(wid)
        self.admission.on_progress(self.now)

    def _transferred(self, flight: _InFlight) -> None:
        flight.record.transfer_end = self.now
        self._to_decode(flight, prefill_locally=False)

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
            rec.first_token = self.now
            self._note("first-token", seq.request_id, wid)
            if seq.prefill_locally:
                # Local prefill ran inside this iteration, on what the cache held at admission.
                rec.cached_tokens = seq.prompt_tokens - seq.local_prefill_tokens
                rec.prefill_start = rec.prefill_end = rec.transfer_end = self.now
                self.decode_router.finish_prefill(seq.request_id)
            for listener in self.first_token_listeners:
                listener(rec)
        for seq in done:
            flight = self._inflight.pop(seq.request_id)
            rec = flight.record
            rec.finished, rec.status = self.now, "ok"
            self._note("done", seq.request_id, wid)
            rec.itl = worker.itl_samples(seq)
            self.decode_router.complete(seq.request_id)
            for listener in self.completion_listeners:
                listener(rec)
        self._kick_decode(wid)
        if first:
            self.admission.on_progress(self.now)

    # -- KV events ---------------------------------------------------------------------------

    def _prefill_sink(self, event: KvEvent) -> None:
        self.prefill_router.index.apply(event)
        self._publish(event)

    def _decode_sink(self, event: KvEvent) -> None:
        self.decode_router.index.apply(event)
        self._publish(event)

    def _publish(self, event: KvEvent) -> None:
        if self.kv_listeners:
            payload = to_payload(event)
            for listener in self.kv_listeners:
                listener(payload)
