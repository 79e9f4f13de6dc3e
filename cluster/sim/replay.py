"""A trace replayed on the simulated cluster, open loop, in virtual time (docs/design.md §8).

Each request arrives at its recorded time (after the replay window's transforms), whatever the
cluster is doing: a queue that grows shows as TTFT, never as clients that wait to send (a closed
loop hides overload). Requests are pulled from the trace one arrival at a time
(:class:`TraceArrivals`), so a trace of any length replays in bounded memory; their prompts come
from the trace's block ids (``cluster.traces.prompts``), hashed once per shared block.

An *arm* is one way of serving the trace (:class:`ReplayArm`): a static policy ``static:τ,ω``
on every router, ``round-robin`` (Dynamo's baseline router mode: every router picks in turn),
or ``adaptive`` (the controller's regime → (τ, ω) table, thresholds at multiples of the calm
TTFT P99 of this trace on this deployment), optionally with the re-split lever. Every arm runs
the PoA estimator and the detector's figures per tick, as the live controller does.
"""

from __future__ import annotations

import math
import re
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from cluster.sim.cluster import SimCluster, SimRequest
from cluster.sim.control import ControlLoop, TickSample
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.loop import few_collections
from cluster.sim.pools import PoolChange
from cluster.sim.profile import HardwareProfile
from cluster.sim.records import RequestRecord, summarize
from cluster.sim.scaling import ScalingDriver, ScalingPolicy
from cluster.sim.scenario import adaptive_controller, unloaded_ttft
from cluster.sim.views import ViewSettings
from cluster.traces.prompts import TracePrompts
from cluster.traces.window import TraceRequest, again
from controller.controller import RegimeChange
from controller.detector import Thresholds
from controller.drain import calm_limit_s
from controller.resplit import ResplitDecision, ResplitSettings
from games.pd_allocation import SloTargets
from games.poa import MAX_AGE_S, PoaEstimator
from router import Policy

__all__ = [
    "ReplayArm",
    "ReplayRun",
    "TraceArrivals",
    "parse_arm",
    "replay_on_sim",
    "trace_calm_thresholds",
    "trace_capacity_rps",
]

_STATIC = re.compile(r"static:([0-9]*\.?[0-9]+),([0-9]*\.?[0-9]+)")
_SLICE_S = 10.0  # virtual seconds run between progress reports
# The calm baseline: the trace's requests one at a time (nobody ahead of them), for 600 s: about
# 130 of Mooncake's (4-5 s each), thousands of Azure's. Even 4 clients in a closed loop keep one
# prefill worker busy with Azure's short answers (28 tokens): not calm.
CALM_CONCURRENCY = 1
CALM_SECONDS = 600.0
# The capacity probe: enough clients to keep every prefill worker's batches full on long
# prompts, long enough to leave its ramp and warm-up behind.
PROBE_CLIENTS, PROBE_S, PROBE_WARMUP_S = 64, 150.0, 30.0
# The PoA estimate is refreshed every 10 virtual seconds, not every tick: one costs ~15 ms and an
# hour of trace has 3,600 ticks, while its window (256 first tokens, over a minute of Mooncake's
# traffic) moves by about a tenth in 10 s. The detector and the policy still tick every second.
POA_EVERY_S = 10.0


CONTROLLED = ("adaptive", "evidence")  # the arms a controller drives


@dataclass(frozen=True)
class ReplayArm:
    """``policy``: ``adaptive`` (the controller with the study's table), ``evidence`` (the
    controller with routing by measured effect, controller/evidence.py), ``static:τ,ω`` or
    ``round-robin``; ``resplit``: the re-split lever (the controller's arms only)."""

    policy: str
    resplit: bool = False
    tau: float = 0.0
    omega: float = 1.0

    @property
    def adaptive(self) -> bool:
        return self.policy in CONTROLLED

    @property
    def round_robin(self) -> bool:
        return self.policy == "round-robin"

    @property
    def name(self) -> str:
        return self.policy + ("+resplit" if self.resplit else "")


def parse_arm(policy: str, resplit: bool = False) -> ReplayArm:
    """An arm from its policy's name (module docstring); ``ValueError`` names what is wrong."""
    if resplit and policy not in CONTROLLED:
        raise ValueError(f"the re-split lever belongs to the controller: {policy!r} is static")
    if policy in (*CONTROLLED, "round-robin"):
        return ReplayArm(policy, resplit)
    found = _STATIC.fullmatch(policy)
    if found is None:
        known = "adaptive, evidence, round-robin, static:TAU,OMEGA"
        raise ValueError(f"unknown policy {policy!r}; known: {known}")
    tau, omega = float(found.group(1)), float(found.group(2))
    return ReplayArm(f"static:{tau:g},{omega:g}", False, tau, omega)


class TraceArrivals:
    """Submits ``requests`` to ``cluster`` at ``start + arrival_s``, pulling the next one only
    when the last has arrived. Request ``i`` is ``t<i>``; ``lines[i]`` its line in the file."""

    def __init__(
        self,
        cluster: SimCluster,
        requests: Iterable[TraceRequest],
        prompts: TracePrompts,
        start: float = 0.0,
    ) -> None:
        self.cluster = cluster
        self.prompts = prompts
        self.start = start
        self.lines = array("q")
        self.sent = 0
        self.done = False
        self.last_arrival = start
        self._pending: Iterator[TraceRequest] = iter(requests)
        self._next()

    def _next(self) -> None:
        request = next(self._pending, None)
        if request is None:
            self.done = True
            return
        at = max(self.start + request.arrival_s, self.cluster.now)
        self.cluster.loop.at(at, self._arrive, request)

    def _arrive(self, request: TraceRequest) -> None:
        tokens, hashes = self.prompts.prompt(request, self.cluster.block_size)
        sim = SimRequest(f"t{request.index}", tokens, request.output_length, hashes=hashes)
        self.cluster.submit(sim)
        self.lines.append(request.line)
        self.sent += 1
        self.last_arrival = self.cluster.now
        self._next()


@dataclass
class ReplayRun:
    """What one arm's replay produced (plain records; the report turns them into files)."""

    arm: ReplayArm
    profile: str
    topology: str
    seed: int
    records: list[RequestRecord]
    lines: Sequence[int]
    timeline: list[TickSample]
    changes: list[RegimeChange] = field(default_factory=list)
    resplits: list[ResplitDecision] = field(default_factory=list)
    pool_changes: list[PoolChange] = field(default_factory=list)
    thresholds: Thresholds | None = None
    wall_s: float = 0.0
    end_s: float = 0.0
    worker_s: float = 0.0  # Σ over workers of the time they held GPUs (not parked)
    scaling_targets: list[tuple[float, int, int]] = field(default_factory=list)

    def summary(self) -> dict[str, float | int]:
        """The arm's figures over every request (TTFT, ITL, E2E, throughput over the replay,
        prefix reuse: the share of prompt tokens served from a cache)."""
        s = summarize(self.records, 0.0, math.inf, by="arrival")
        done = sum(1 for r in self.records if r.finished is not None)
        ttfts = sorted(r.ttft for r in self.records if r.ttft is not None)
        return {
            "requests": len(self.records),
            "completed": done,
            "ttft_p50_s": s.ttft_p50_s,
            "ttft_p90_s": float(ttfts[int(0.9 * (len(ttfts) - 1))]) if ttfts else math.nan,
            "ttft_p99_s": s.ttft_p99_s,
            "itl_p50_s": s.itl_p50_s,
            "itl_p99_s": s.itl_p99_s,
            "e2e_p99_s": s.e2e_p99_s,
            "throughput_rps": done / self.end_s if self.end_s > 0 else math.nan,
            "prefix_reuse": s.cache_hit_rate,
            "resplits": len(self.resplits),
            # The controller's first record is its start (the calm policy pushed): not a switch.
            "regime_changes": max(0, len(self.changes) - 1),
            "virtual_s": self.end_s,
            "wall_s": self.wall_s,
        }


def _in_turn(
    cluster: SimCluster, requests: Sequence[TraceRequest], prompts: TracePrompts, prefix: str
) -> Callable[[], SimRequest]:
    """A closed loop's source: ``requests`` in turn, each lap as new requests
    (``cluster.traces.again``), so that no lap finds another's blocks in the caches."""
    if not requests:
        raise ValueError("a closed loop over a trace needs at least one of its requests")
    sent = [0]

    def source() -> SimRequest:
        lap, k = divmod(sent[0], len(requests))
        request = again(requests[k], lap)
        tokens, hashes = prompts.prompt(request, cluster.block_size)
        sent[0] += 1
        return SimRequest(f"{prefix}{sent[0]}", tokens, request.output_length, hashes=hashes)

    return source


def trace_calm_thresholds(
    profile: HardwareProfile,
    topology: str,
    calm: Sequence[TraceRequest],
    prompts: TracePrompts,
    seed: int = 0,
) -> Thresholds:
    """The controller's thresholds for this trace on this deployment: multiples
    (``Thresholds.calibrated``) of the TTFT P99 of a calm closed loop (``CALM_CONCURRENCY``
    client) sending the trace's own requests ``calm`` in turn: its traffic, with nobody ahead."""
    if not calm:
        raise ValueError("the calm baseline needs at least one request of the trace")
    cluster = SimCluster(profile, topology, seed=seed)
    source = _in_turn(cluster, calm, prompts, "calm")
    load = ClosedLoop(cluster, source, [Phase(CALM_SECONDS, CALM_CONCURRENCY, 5.0)])
    cluster.loop.run(load.end)
    baseline = summarize(cluster.records, 10.0, load.end).ttft_p99_s
    if not math.isfinite(baseline) or baseline <= 0:
        raise ValueError(f"the calm baseline measured no TTFT ({baseline}); the trace is empty?")
    return Thresholds.calibrated(baseline)


def trace_capacity_rps(
    profile: HardwareProfile,
    topology: str,
    requests: Sequence[TraceRequest],
    prompts: TracePrompts,
    seed: int = 0,
) -> float:
    """X_max: the throughput of a saturating closed loop (``PROBE_CLIENTS``) sending the trace's
    requests in turn (their prompt and output lengths, their sharing) on this deployment; the
    arrival rate past which its queues grow. Loads are chosen as shares of it."""
    cluster = SimCluster(profile, topology, seed=seed)
    source = _in_turn(cluster, requests, prompts, "probe")
    load = ClosedLoop(cluster, source, [Phase(PROBE_S, PROBE_CLIENTS, 5.0)])
    with few_collections():
        cluster.loop.run(load.end)
    return summarize(cluster.records, PROBE_WARMUP_S, load.end).throughput_rps


def replay_on_sim(
    requests: Iterable[TraceRequest],
    prompts: TracePrompts,
    profile: HardwareProfile,
    topology: str,
    arm: ReplayArm,
    *,
    seed: int = 0,
    thresholds: Thresholds | None = None,
    views: ViewSettings | None = None,
    resplit: ResplitSettings | None = None,
    slo: SloTargets | None = None,
    poa_every_s: float = POA_EVERY_S,
    on_progress: Callable[[int, int, float], None] | None = None,
    scaling: ScalingPolicy | None = None,
) -> ReplayRun:
    """Replay ``requests`` through ``arm`` on a fresh cluster (module docstring).

    ``thresholds``: the detector's (every arm gets its drain limit from them, so static and
    adaptive arms age their PoA windows alike); required for an adaptive arm. ``slo``: the
    targets the controller's Game 1 plans for (``adaptive_controller``'s default without it).
    ``on_progress(sent, finished, virtual_now)`` after every ``_SLICE_S`` virtual seconds.
    ``scaling``: a scaling policy of Dynamo's replay (``cluster.sim.scaling``), such as Dynamo's
    planner, setting the pools' sizes under a static or round-robin arm."""
    if arm.adaptive and thresholds is None:
        raise ValueError("an adaptive arm needs the detector's thresholds")
    if arm.adaptive and scaling is not None:
        raise ValueError("a scaling policy sizes a static arm's pools; the controller has its own")
    started = time.perf_counter()
    cluster = SimCluster(
        profile,
        topology,
        seed=seed,
        views=views,
        selection="round_robin" if arm.round_robin else "cost",
    )
    if not arm.adaptive and not arm.round_robin:
        cluster.set_policy(Policy(arm.tau, arm.omega))
    arrivals = TraceArrivals(cluster, requests, prompts)
    controller = None
    loop_ref: list[ControlLoop] = []
    if arm.adaptive:
        assert thresholds is not None
        lever = (resplit or ResplitSettings()) if arm.resplit else None
        controller = adaptive_controller(
            cluster, thresholds, None, lever, lambda: loop_ref[0].arrival_rate(),
            evidence=arm.policy == "evidence", slo=slo,
        )  # fmt: skip
    estimator = PoaEstimator(256, MAX_AGE_S, unloaded_latency_s=unloaded_ttft(profile))
    limit = None if thresholds is None else calm_limit_s(thresholds)
    control = ControlLoop(
        cluster, controller, estimator, drain_limit_s=limit, poa_every_s=poa_every_s
    )
    loop_ref.append(control)
    driver = ScalingDriver(cluster, scaling) if scaling is not None else None
    loop = cluster.loop
    finished = [0]
    cluster.completion_listeners.append(lambda _: finished.__setitem__(0, finished[0] + 1))
    with few_collections():
        while True:
            loop.run(loop.now + _SLICE_S)
            if on_progress is not None:
                on_progress(arrivals.sent, finished[0], loop.now)
            if arrivals.done and cluster.in_flight == 0:
                break
    end = max((r.finished or 0.0) for r in cluster.records) if cluster.records else 0.0
    return ReplayRun(
        arm=arm,
        profile=profile.name,
        topology=str(cluster.topology),
        seed=seed,
        records=cluster.records,
        lines=arrivals.lines,
        timeline=control.timeline,
        changes=controller.changes if controller else [],
        resplits=controller.resplitter.decisions if controller and controller.resplitter else [],
        pool_changes=control.pool_changes,
        thresholds=thresholds,
        wall_s=time.perf_counter() - started,
        end_s=end,
        worker_s=cluster.pool_state.worker_seconds(end),
        scaling_targets=driver.targets if driver is not None else [],
    )
