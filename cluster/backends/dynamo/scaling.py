"""Our re-split as a scaling policy of Dynamo's offline replay (docs/design.md §6).

``dynamo._core.run_mocker_trace_replay(..., scaling_policy=obj)`` calls ``obj.initial_tick_ms()``
once and ``obj.on_tick(snapshot)`` at every tick it asked for; the answer sets the pools' target
sizes (``target_prefill``, ``target_decode``; None leaves one as it is) and the next tick
(``next_tick_ms``). :class:`ResplitScaling` answers with the same decision core the simulator
and the live service run (``controller.resplit.Resplitter``), fed from the snapshot:

- the traffic (``controller.traffic.Traffic``): λ, mean prompt and output and the KV hit rate
  over the last ``TRAFFIC_WINDOW_S`` of the snapshot's traffic windows, and the prefill pool's
  queue, the sum over its workers' latest forward-pass metrics of the prompt tokens queued and
  scheduled;
- the regime: the window's mean TTFT against the detector's thresholds θ1 < θ2 (the replay
  reports a mean per window, not the P99 the live detector smooths; the planned move does not
  need it, the move back and the capacity-bound move read it);
- the pools (:class:`ReplayPools`): Dynamo adds and removes workers; a role switch of k
  workers is k decode workers drained, then k prefill workers started (their ``startup_time``
  the profile's role switch), so the six GPUs are never seven. Dynamo cannot hand a draining
  worker back, so a move here is never called off.

No Dynamo import here: the replay calls the object, whatever it is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Literal

from controller.detector import Regime, Thresholds
from controller.resplit import Pools, ResplitSettings, Resplitter, Role, SplitPlanner
from controller.traffic import Traffic, TrafficShape

__all__ = ["ReplayPools", "ResplitScaling", "snapshot_traffic"]

TRAFFIC_WINDOW_S = 30.0  # as the simulator's (cluster.sim.control.TRAFFIC_WINDOW_S)
Phase = Literal["idle", "draining", "starting"]
Snapshot = Mapping[str, object]


def _num(record: Mapping[str, object], key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _count(snapshot: Snapshot, key: str) -> int:
    return int(_num(snapshot, key))


class ReplayPools:
    """``controller.resplit.PoolTarget`` over Dynamo's replay: the snapshot's pools, and a
    switch as two steps (module docstring) the next ``on_tick`` answers apply."""

    def __init__(self, start: Pools, switch_s: float) -> None:
        self.serving = start
        self.switch = switch_s
        self.phase: Phase = "idle"
        self.to_role: Role | None = None
        self.target: Pools | None = None  # the sizes asked of Dynamo, until it has them
        self.step = 1  # workers the switch under way moves
        self.moves = 0

    def observe(self, snapshot: Snapshot) -> None:
        """This tick's pools; a switch under way takes its next step. The snapshot's active
        workers are the ready ones: a starting or draining worker counts in neither pool (its
        ``total_*_count`` holds all three)."""
        prefill = _count(snapshot, "active_prefill_count")
        self.serving = Pools(prefill, _count(snapshot, "active_decode_count"))
        moving = sum(
            _count(snapshot, f"{state}_{pool}_count")
            for state in ("starting", "draining")
            for pool in ("prefill", "decode")
        )
        settled = moving == 0 and self.serving == self.target
        if self.phase == "draining" and settled and self.to_role is not None:
            self.phase = "starting"
            grow, k = self.to_role, self.step
            self.target = Pools(
                self.serving.prefill + k * (grow == "prefill"),
                self.serving.decode + k * (grow == "decode"),
            )
        elif self.phase == "starting" and settled:
            self.phase, self.to_role, self.target = "idle", None, None

    def answer(self) -> tuple[int | None, int | None]:
        if self.target is None:
            return None, None
        return self.target.prefill, self.target.decode

    def pools(self) -> Pools:
        return self.serving

    def resplitting(self) -> bool:
        return self.phase != "idle"

    def resplit(self, to_role: Role, reason: str, workers: int = 1) -> None:
        p, d, k = self.serving.prefill, self.serving.decode, workers
        self.target = Pools(p - k * (to_role == "decode"), d - k * (to_role == "prefill"))
        self.phase, self.to_role, self.step = "draining", to_role, k
        self.moves += 1

    def max_step(self) -> int:
        """Any number: Dynamo drains and starts workers side by side."""
        return self.serving.prefill + self.serving.decode

    def switch_s(self) -> float:
        return self.switch

    def cancel(self, reason: str) -> bool:
        return False  # Dynamo drains a worker to its removal (module docstring)


def snapshot_traffic(
    windows: Sequence[Mapping[str, object]], prefill_fpm: Mapping[object, Mapping[str, object]]
) -> Traffic:
    """The traffic (``controller.traffic``) of the snapshot's recent traffic ``windows`` and the
    prefill workers' latest forward-pass metrics."""

    duration = sum(_num(w, "duration_s") for w in windows)
    arrived = sum(_num(w, "num_req") for w in windows)
    shaped = sum(_num(w, "shape_count") for w in windows)
    hits = sum(_num(w, "hit_rate_count") for w in windows)
    shape = None
    if shaped > 0:
        isl = sum(_num(w, "avg_isl") * _num(w, "shape_count") for w in windows) / shaped
        osl = sum(_num(w, "avg_osl") * _num(w, "shape_count") for w in windows) / shaped
        reuse = (
            sum(_num(w, "avg_kv_hit_rate") * _num(w, "hit_rate_count") for w in windows) / hits
            if hits > 0
            else 0.0
        )
        shape = TrafficShape(max(1.0, isl), max(1.0, osl), min(1.0, max(0.0, reuse)))
    queued = sum(
        _num(m, "sum_queued_prefill_tokens") + _num(m, "sum_prefill_tokens")
        for m in prefill_fpm.values()
    )
    return Traffic(arrived / duration if duration > 0 else 0.0, shape, queued)


class ResplitScaling:
    """The re-split lever as Dynamo's replay scaling policy (module docstring), ticking every
    ``tick_s`` seconds of the replay's virtual time."""

    def __init__(
        self,
        planner: SplitPlanner,
        start: Pools,
        thresholds: Thresholds,
        switch_s: float,
        settings: ResplitSettings | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self.target = ReplayPools(start, switch_s)
        self.resplitter = Resplitter(self.target, planner, settings, home=start)
        self.thresholds = thresholds
        self.tick_ms = tick_s * 1000.0
        self._windows: deque[tuple[float, Mapping[str, object]]] = deque()
        self._fpm: dict[object, Mapping[str, object]] = {}
        self.timeline: list[tuple[float, Pools, float]] = []  # (t, pools, queued tokens)

    def initial_tick_ms(self) -> float:
        return self.tick_ms

    def regime(self, windows: Sequence[Mapping[str, object]]) -> Regime:
        """The windows' mean TTFT against θ1 < θ2."""
        weight = sum(_num(w, "ttft_count") for w in windows)
        if weight <= 0:
            return Regime.BELOW
        ttft_s = sum(_num(w, "avg_ttft_ms") * _num(w, "ttft_count") for w in windows)
        ttft_s /= weight * 1000.0
        if ttft_s >= self.thresholds.theta2:
            return Regime.SATURATED
        return Regime.TRANSITION if ttft_s >= self.thresholds.theta1 else Regime.BELOW

    def on_tick(self, snapshot: Mapping[str, object]) -> dict[str, float | int | None]:
        now = _num(snapshot, "now_ms") / 1000.0
        window = snapshot.get("traffic")
        if isinstance(window, Mapping):
            self._windows.append((now, window))
        while self._windows and self._windows[0][0] <= now - TRAFFIC_WINDOW_S:
            self._windows.popleft()
        active = snapshot.get("active_prefill_ids")
        fpms = snapshot.get("prefill_fpm_snapshots")
        if isinstance(fpms, list):
            for m in fpms:
                if isinstance(m, Mapping):
                    self._fpm[m.get("worker_id")] = m
        if isinstance(active, list):
            self._fpm = {k: v for k, v in self._fpm.items() if k in active}
        windows = [w for _, w in self._windows]
        traffic = snapshot_traffic(windows, self._fpm)
        self.target.observe(snapshot)
        self.resplitter.tick(now, self.regime(windows), traffic.arrival_rate, traffic=traffic)
        self.timeline.append((now, self.target.serving, traffic.queued_prefill_tokens))
        prefill, decode = self.target.answer()
        return {
            "target_prefill": prefill,
            "target_decode": decode,
            "next_tick_ms": (now * 1000.0) + self.tick_ms,
        }
