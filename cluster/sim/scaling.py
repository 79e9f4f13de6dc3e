"""A scaling policy of Dynamo's offline replay, run over the simulated cluster (docs/design.md §6).

Dynamo's replay calls ``policy.initial_tick_ms()`` once and ``policy.on_tick(snapshot)`` at each
tick the policy asks for; the answer sets the pools' sizes (``target_prefill``,
``target_decode``; None leaves one as it is) and the next tick (``next_tick_ms``; None: no more).
:class:`ScalingDriver` speaks the same protocol over a :class:`~cluster.sim.cluster.SimCluster`
in virtual time, so one policy object runs in both simulators: Dynamo's planner
(``dynamo.planner.offline.replay_adapter``) and our re-split as a replay policy
(``cluster.backends.dynamo.scaling.ResplitScaling``) alike. A size is the pools'
``scale_to`` (``cluster.sim.pools``): workers given up drain and park, parked ones start in the
growing role after the profile's role switch, so the cluster never holds more workers than it
has.

The snapshot carries the fields of Dynamo's that these policies read:

- ``now_ms``, ``tick_ordinal``;
- per pool: ``active_*`` (serving: ids and count), ``starting_*`` and ``draining_*`` (ids,
  counts), ``non_draining_*_count`` (serving or starting) and ``total_*_count``;
- ``traffic``: the window since the previous tick, as Dynamo's mocker drains it: arrivals
  (``num_req``, offered load), the prompt and output lengths of the requests that finished
  (``avg_isl``, ``avg_osl``, weighted by ``shape_count``), the mean TTFT of the first tokens and
  the mean ITL of the finished requests (with their counts), and the KV hit rate of the prefills
  that answered (cached / prompt tokens, ``hit_rate_count`` of them);
- ``prefill_fpm_snapshots``, ``decode_fpm_snapshots``: each serving worker's forward-pass
  metrics now (Dynamo's ``ForwardPassMetrics`` fields): the requests its engine runs and those
  it queues, their prompt tokens (prefill) or KV tokens (decode), with their variances.
  ``wall_time`` is the worker's busy seconds since the previous tick: the simulator keeps no
  per-iteration log, and the load-based modes run here read queues and KV only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from cluster.sim.cluster import SimCluster
from cluster.sim.records import RequestRecord
from cluster.sim.views import ROLES

__all__ = ["ScalingDriver", "ScalingPolicy"]


class ScalingPolicy(Protocol):
    """Dynamo's replay scaling protocol (module docstring)."""

    def initial_tick_ms(self) -> float: ...

    def on_tick(self, snapshot: dict[str, object]) -> Mapping[str, object]: ...


def _moments(values: Sequence[float]) -> tuple[int, float, float]:
    """(count, sum, population variance)."""
    n = len(values)
    if n == 0:
        return 0, 0.0, 0.0
    total = float(sum(values))
    mean = total / n
    return n, total, sum((v - mean) ** 2 for v in values) / n


class _Window:
    """The traffic since the last tick, gathered from the cluster's listeners."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.isl = self.osl = self.finished = 0.0
        self.ttft = self.first_tokens = 0.0
        self.itl = self.itls = 0.0
        self.hit = self.hits = 0.0

    def first_token(self, record: RequestRecord) -> None:
        if record.ttft is not None:
            self.ttft += record.ttft
            self.first_tokens += 1
        if record.prompt_tokens > 0:
            self.hit += min(1.0, record.cached_tokens / record.prompt_tokens)
            self.hits += 1

    def completed(self, record: RequestRecord) -> None:
        if record.status != "ok":
            return
        self.isl += record.prompt_tokens
        self.osl += record.output_tokens
        self.finished += 1
        if record.mean_itl is not None:
            self.itl += record.mean_itl
            self.itls += 1

    def record(self, duration_s: float, arrived: int) -> dict[str, object]:
        def mean(total: float, n: float) -> float:
            return total / n if n else 0.0

        return {
            "duration_s": duration_s,
            "num_req": float(arrived),
            "shape_count": self.finished,
            "avg_isl": mean(self.isl, self.finished),
            "avg_osl": mean(self.osl, self.finished),
            "ttft_count": self.first_tokens,
            "avg_ttft_ms": 1000.0 * mean(self.ttft, self.first_tokens),
            "itl_count": self.itls,
            "avg_itl_ms": 1000.0 * mean(self.itl, self.itls),
            "hit_rate_count": self.hits,
            "avg_kv_hit_rate": mean(self.hit, self.hits),
            "accept_length_forward_count": 0.0,
            "avg_accept_length": None,  # no speculative decoding here
        }


class ScalingDriver:
    """Runs ``policy`` over ``cluster`` (module docstring) from its first tick on; ``targets``
    records each size it set, ``(t, prefill, decode)``."""

    def __init__(self, cluster: SimCluster, policy: ScalingPolicy) -> None:
        self.cluster = cluster
        self.policy = policy
        self.targets: list[tuple[float, int, int]] = []
        self._window = _Window()
        self._ordinal = 0
        self._last_t = cluster.now
        self._arrived = len(cluster.records)
        self._busy: dict[tuple[str, int], float] = {}
        cluster.first_token_listeners.append(self._window.first_token)
        cluster.completion_listeners.append(self._window.completed)
        first = _seconds(policy.initial_tick_ms(), "initial_tick_ms")
        cluster.loop.at(max(first, cluster.now), self._tick)

    def snapshot(self) -> dict[str, object]:
        """This tick's snapshot (module docstring); drains the traffic window."""
        cluster, pools = self.cluster, self.cluster.pool_state
        now = cluster.now
        snap: dict[str, object] = {"now_ms": now * 1000.0, "tick_ordinal": self._ordinal}
        for role in ROLES:
            active = list(cluster.views.workers(role))
            starting = list(pools.starting(role))
            draining = list(pools.leaving(role))
            snap[f"active_{role}_ids"] = active
            snap[f"starting_{role}_ids"] = starting
            snap[f"draining_{role}_ids"] = draining
            snap[f"active_{role}_count"] = len(active)
            snap[f"starting_{role}_count"] = len(starting)
            snap[f"draining_{role}_count"] = len(draining)
            snap[f"non_draining_{role}_count"] = len(active) + len(starting)
            snap[f"total_{role}_count"] = len(active) + len(starting) + len(draining)
        arrived, dt = len(cluster.records), now - self._last_t
        snap["traffic"] = self._window.record(dt, arrived - self._arrived)
        self._window.clear()
        self._arrived = arrived
        snap["prefill_fpm_snapshots"] = [
            self._prefill_fpm(w, dt) for w in cluster.views.workers("prefill")
        ]
        snap["decode_fpm_snapshots"] = [
            self._decode_fpm(w, dt) for w in cluster.views.workers("decode")
        ]
        self._last_t = now
        return snap

    def _wall(self, role: str, worker: int, busy: float, dt: float) -> float:
        last = self._busy.get((role, worker), busy)
        self._busy[(role, worker)] = busy
        return min(max(busy - last, 0.0), dt)

    def _prefill_fpm(self, worker: int, dt: float) -> dict[str, object]:
        engine = self.cluster.prefill[worker]
        n, tokens, var = _moments([j.remaining for j in engine.running])
        q, queued, qvar = _moments([j.prompt_tokens for j in engine.waiting])
        return _fpm(worker, self._wall("prefill", worker, engine.busy_time, dt)) | {
            "num_prefill_requests": n,
            "sum_prefill_tokens": int(tokens),
            "var_prefill_length": var,
            "sum_prefill_kv_tokens": sum(j.cached_tokens for j in engine.running),
            "num_queued_prefill": q,
            "sum_queued_prefill_tokens": int(queued),
            "var_queued_prefill_length": qvar,
        }

    def _decode_fpm(self, worker: int, dt: float) -> dict[str, object]:
        engine = self.cluster.decode[worker]
        contexts = [
            s.prompt_tokens + max(0, engine.iteration - s.first_iteration) for s in engine.running
        ]
        n, _, var = _moments(contexts)
        q, queued, qvar = _moments([s.prompt_tokens for s in engine.pending])
        return _fpm(worker, self._wall("decode", worker, engine.busy_time, dt)) | {
            "num_decode_requests": n,
            "sum_decode_kv_tokens": engine.kv_tokens,
            "var_decode_kv_tokens": var,
            "num_queued_decode": q,
            "sum_queued_decode_kv_tokens": int(queued),
            "var_queued_decode_kv_tokens": qvar,
        }

    def _tick(self) -> None:
        answer = self.policy.on_tick(self.snapshot())
        self._ordinal += 1
        prefill, decode = answer.get("target_prefill"), answer.get("target_decode")
        if prefill is not None or decode is not None:
            pools = self.cluster.pool_state
            p = pools.size("prefill") if prefill is None else _size(prefill, "target_prefill")
            d = pools.size("decode") if decode is None else _size(decode, "target_decode")
            self.targets.append((self.cluster.now, p, d))
            pools.scale_to(p, max(1, d), reason="scaling policy")
        after = answer.get("next_tick_ms")
        if after is not None:
            at = _seconds(after, "next_tick_ms")
            self.cluster.loop.at(max(at, self.cluster.now + 1e-3), self._tick)


def _fpm(worker: int, wall_s: float) -> dict[str, object]:
    """The fields every forward-pass record carries; the role's own are added to it."""
    zero: dict[str, object] = dict.fromkeys(
        (
            "num_prefill_requests", "sum_prefill_tokens", "sum_prefill_kv_tokens",
            "num_decode_requests", "sum_decode_kv_tokens", "num_queued_prefill",
            "sum_queued_prefill_tokens", "num_queued_decode", "sum_queued_decode_kv_tokens",
        ),
        0,
    )  # fmt: skip
    variances = (
        "var_prefill_length", "var_decode_kv_tokens", "var_queued_prefill_length",
        "var_queued_decode_kv_tokens",
    )  # fmt: skip
    return (
        {"worker_id": worker, "dp_rank": 0, "wall_time": wall_s}
        | zero
        | dict.fromkeys(variances, 0.0)
    )


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"a scaling policy's {name} must be a finite number, got {value!r}")
    return float(value) / 1000.0


def _size(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a scaling policy's {name} must be an int >= 0, got {value!r}")
    return value
