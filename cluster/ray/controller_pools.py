"""The controller actor's second lever, wired (docs/design.md §4 "Two levers, not one").

- :class:`ResplitSection`: the ``controller.resplit`` section of the service's config (a
  StrictModel whose errors name the field), mapped onto ``controller.resplit.ResplitSettings``;
- :class:`ArrivalMeter`: the measured arrival rate the resplitter asks Game 1 about;
- :class:`WallPlanner`: Game 1 (``cluster.sim.planning.GameOnePlanner``) in wall-clock units;
- :func:`build_pools`: the controller actor's ``ActorPools`` + ``Resplitter``.

Units: the serve runtime runs the profile's engines ``speedup`` times faster than the hardware
(virtual = wall · speedup). Game 1 and the profile speak virtual seconds, the controller wall
seconds, so λ_virtual = λ_wall / speedup, a capacity of κ requests per virtual second is
κ · speedup per wall second, the TTFT SLO is θ1_wall · speedup, and the warm-up of
``role_switch_s`` virtual seconds lasts ``role_switch_s / speedup`` wall seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pydantic import Field

from cluster.actor_ref import ActorRef
from cluster.events import PoolsEvent
from cluster.models import StrictModel
from cluster.ray.launcher import RayLauncher
from cluster.ray.pools import ActorPools, Launcher
from cluster.sim.cluster import Topology
from cluster.sim.planning import GameOnePlanner
from cluster.sim.profile import HardwareProfile, load_profile
from cluster.worker_spec import WorkerSpec, worker_plug
from controller.resplit import (
    RESPLIT_BOUNDS,
    Pools,
    ResplitDecision,
    ResplitSettings,
    Resplitter,
    Role,
)
from controller.traffic import TrafficShape
from games.pd_allocation import SloTargets

__all__ = ["ArrivalMeter", "ResplitSection", "WallPlanner", "build_pools"]

ARRIVAL_WINDOW_S = 10.0
_B = RESPLIT_BOUNDS  # one table of bounds for the dataclass and this edge model
_D = ResplitSettings()  # and one set of defaults: the dataclass's


class ResplitSection(StrictModel):
    """``enabled``: the controller may move workers on its own (false: routing only; an
    operator's ``resplit_now`` still works). The rest are
    ``controller.resplit.ResplitSettings``'s, plus ``drain_timeout_s``: how long a moving worker
    may take to finish its requests before the re-split is abandoned (wall seconds)."""

    enabled: bool = True
    dominance: float = Field(_D.dominance, ge=_B["dominance"][0], le=_B["dominance"][1])
    dwell_ticks: int = Field(_D.dwell_ticks, ge=_B["dwell_ticks"][0], le=_B["dwell_ticks"][1])
    release_fraction: float = Field(
        _D.release_fraction, ge=_B["release_fraction"][0], le=_B["release_fraction"][1]
    )
    release_ticks: int = Field(
        _D.release_ticks, ge=_B["release_ticks"][0], le=_B["release_ticks"][1]
    )
    cooldown_s: float = Field(_D.cooldown_s, ge=_B["cooldown_s"][0], le=_B["cooldown_s"][1])
    drain_timeout_s: float = Field(60.0, gt=0.0, le=3600.0)

    def settings(self) -> ResplitSettings:
        """The room's record: every field but the two the service adds."""
        return ResplitSettings(**self.model_dump(exclude={"enabled", "drain_timeout_s"}))


class ArrivalMeter:
    """Requests per wall second over a trailing window.

    Fed by ``route`` events, not ``first_token``: a request is routed as soon as it is admitted,
    while its first token waits for the prefill queue, so under capacity saturation (exactly
    when the resplitter asks) the first-token rate is the prefill pool's throughput, capped by
    the split under question, and the route rate is the demand."""

    def __init__(self, window_s: float = ARRIVAL_WINDOW_S) -> None:
        self.window_s = window_s
        self._times: deque[float] = deque()
        self._since: float | None = None  # first observation: a young window is shorter

    def observe(self, now: float) -> None:
        if self._since is None:
            self._since = now
        self._times.append(now)
        self._trim(now)

    def rate(self, now: float) -> float:
        self._trim(now)
        if self._since is None:
            return 0.0
        span = min(self.window_s, max(now - self._since, 1.0))
        return len(self._times) / span

    def _trim(self, now: float) -> None:
        while self._times and self._times[0] < now - self.window_s:
            self._times.popleft()


class WallPlanner:
    """``controller.resplit.SplitPlanner`` in the controller's wall-clock units: Game 1 on the
    service's GPUs with the SLO ``cluster.sim.scenario`` uses (TTFT θ1, ITL 1.5·d0), asked in
    the profile's virtual seconds (module docstring)."""

    def __init__(
        self, profile: HardwareProfile, pools: Pools, speedup: float, ttft_slo_wall_s: float
    ) -> None:
        slo = SloTargets(ttft_s=ttft_slo_wall_s * speedup, itl_s=1.5 * profile.decode.d0_s)
        self.game = GameOnePlanner(profile, Topology(pools.prefill, pools.decode), slo)
        self.speedup = speedup

    def best_split(self, arrival_rate: float, shape: TrafficShape | None = None) -> Pools:
        return self.game.best_split(arrival_rate / self.speedup, shape)

    def capacity(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        return self.game.capacity(pools, shape) * self.speedup

    def prefill_rate(self, pools: Pools, shape: TrafficShape | None = None) -> float:
        return self.game.prefill_rate(pools, shape) * self.speedup


def build_pools(
    *,
    section: ResplitSection,
    workers: dict[str, list[int]],
    spec: WorkerSpec,
    router: ActorRef | None,
    publish: Callable[[PoolsEvent], object],
    ttft_slo_wall_s: float,
    call_timeout_s: float,
    detached_service: bool,
    launcher: Launcher | None = None,
    on_decision: Callable[[ResplitDecision], None] | None = None,
) -> tuple[ActorPools, Resplitter]:
    """The pools of the deployed workers (ids by role; handles found by name when needed)
    and the resplitter that drives them."""
    profile = load_profile(spec.profile)
    # Handles are found by name when first needed (ActorPools): the deploy-time roles may be
    # stale after a restart of this actor, a name always finds the current actor.
    roles: dict[Role, dict[int, ActorRef | None]] = {
        "prefill": dict.fromkeys(workers.get("prefill", [])),
        "decode": dict.fromkeys(workers.get("decode", [])),
    }
    pools = ActorPools(
        workers=roles,
        router=router,
        launcher=launcher or RayLauncher(spec, detached_service=detached_service),
        publish=publish,
        warmup_s=worker_plug(spec).switch_warmup_s(spec, profile.role_switch_s),
        drain_timeout_s=section.drain_timeout_s,
        call_timeout_s=call_timeout_s,
    )
    home = pools.pools()
    planner = WallPlanner(profile, home, spec.speedup, ttft_slo_wall_s)
    resplitter = Resplitter(pools, planner, section.settings(), home=home, on_decision=on_decision)
    return pools, resplitter
