"""Router replicas with stale views (cluster/sim/views.py, docs/design.md §6)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import numpy as np
import pytest

from cluster.sim.cluster import SimCluster, SimRequest, ViewSettings
from cluster.sim.loadgen import ClosedLoop, Phase
from cluster.sim.loop import EventLoop
from cluster.sim.profile import HardwareProfile, load_profile
from cluster.sim.records import RequestRecord
from cluster.sim.scenario import template_source
from router import Policy

PROFILE = "b200-llama70b-fp8-tp4"
STALE = ViewSettings.stale(replicas=4, report_period_s=0.25, delay_s=0.05)


def _fingerprint(cluster: SimCluster) -> tuple[str, str]:
    rows = [
        (
            r.request_id,
            r.decode_worker,
            r.prefill_worker,
            round(r.ttft, 9),
            round(r.finished, 9),
            r.cached_tokens,
        )
        for r in cluster.records
        if r.ttft is not None and r.finished is not None
    ]
    assert len(rows) == len(cluster.records)
    log = cluster.loop.log
    return (
        hashlib.sha256(repr(rows).encode()).hexdigest()[:16],
        hashlib.sha256(repr(log).encode()).hexdigest()[:16],
    )


def _without_attention() -> HardwareProfile:
    """The profile as it was when the fingerprints below were taken: no attention term in
    prefill (added later; these tests are about router views, not prefill cost)."""
    profile = load_profile(PROFILE)
    return dataclasses.replace(
        profile, prefill=dataclasses.replace(profile.prefill, e_s_per_token_pair=0.0)
    )


def _short_run(topology: str, seed: int, **kwargs: Any) -> SimCluster:
    profile = _without_attention()
    cluster = SimCluster(profile, topology, seed=seed, loop=EventLoop(record=True), **kwargs)
    ClosedLoop(cluster, template_source(profile, seed), [Phase(4.0, 48, ramp=0.5)])
    cluster.loop.run()
    return cluster


# Captured from the simulator before router replicas existed (one decode router, one prefill
# router fixed at Policy(0, 1)), with this exact run: the defaults must not move a single record.
BEFORE_REPLICAS = {
    ("1P/2D", 3): ("5d25543258baac2f", "bb2e6251bbc99ca1"),
    ("2P/4D", 7): ("96b8d88ce00b6ffb", "2529ea53f635f610"),
}


@pytest.mark.parametrize(("topology", "seed"), sorted(BEFORE_REPLICAS))
def test_defaults_reproduce_the_lone_router_record_for_record(topology: str, seed: int) -> None:
    default = _short_run(topology, seed)
    assert len(default.records) == 96
    assert _fingerprint(default) == BEFORE_REPLICAS[topology, seed]
    explicit = _short_run(topology, seed, views=ViewSettings(1, None, 0.0))
    assert _fingerprint(explicit) == BEFORE_REPLICAS[topology, seed]
    assert len(default.routers) == 1 and default.routers[0].decode is default.decode_router


def test_first_records_of_the_lone_router_run() -> None:
    """Readable values of the same captured run (the digest above holds all of them)."""
    cluster = _short_run("2P/4D", 7)
    head = [(r.decode_worker, r.prefill_worker, round(r.ttft or 0, 9)) for r in cluster.records]
    assert head[:4] == [(2, 0, 0.041187456), (3, 1, 0.030962326), (4, 0, 0.138160592),
                        (5, 1, 0.118067561)]  # fmt: skip


def test_decode_only_policy_still_reproduces_the_old_runs() -> None:
    """Before, a policy reached the decode router only; setting it there alone still does that."""
    profile = _without_attention()
    cluster = SimCluster(profile, "2P/4D", seed=7, loop=EventLoop(record=True))
    cluster.decode_router.set_policy(Policy(0.5, 0.3, 0))
    ClosedLoop(cluster, template_source(profile, 7), [Phase(4.0, 48, ramp=0.5)])
    cluster.loop.run()
    assert _fingerprint(cluster)[0] == "47a0a0490843b080"


def _per_period_imbalance(
    records: list[RequestRecord], workers: list[int], role: str, period: float, start: float
) -> float:
    """Mean over report periods of max/mean requests routed per worker in that period."""
    bins: dict[int, dict[int, int]] = {}
    for r in records:
        worker = r.prefill_worker if role == "prefill" else r.decode_worker
        if r.routed is None or r.routed < start or worker is None:
            continue
        counts = bins.setdefault(int(r.routed // period), {})
        counts[worker] = counts.get(worker, 0) + 1
    ratios = []
    for counts in bins.values():
        column = np.array([counts.get(w, 0) for w in workers], dtype=float)
        if column.sum() >= 4:
            ratios.append(column.max() / column.mean())
    return float(np.mean(ratios))


def _herd(tau: float, views: ViewSettings | None) -> tuple[float, float]:
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, "2P/4D", seed=0, views=views)
    cluster.set_policy(Policy(tau, 1.0, 1))
    load = ClosedLoop(cluster, template_source(profile, 0), [Phase(8.0, 256, ramp=1.0)])
    cluster.loop.run(load.end)
    records = cluster.records
    return (
        _per_period_imbalance(records, [0, 1], "prefill", 0.25, 2.0),
        _per_period_imbalance(records, [2, 3, 4, 5], "decode", 0.25, 2.0),
    )


def test_stale_views_herd_at_tau_zero_and_a_temperature_spreads() -> None:
    """Four replicas that learn load every 0.25 s, 50 ms late, under a saturating closed loop:
    lowest-cost routing sends a period's requests to whichever worker looked least loaded at the
    last report; τ = 0.8 spreads them. (Measured, seed 0: prefill 1.86 vs 1.35, decode 3.09 vs
    1.79; a fresh single view at τ = 0: 1.39 and 1.28.)"""
    prefill_herd, decode_herd = _herd(0.0, STALE)
    prefill_hot, decode_hot = _herd(0.8, STALE)
    prefill_fresh, decode_fresh = _herd(0.0, None)
    assert prefill_herd > 1.6 and decode_herd > 2.5
    assert prefill_hot < prefill_herd - 0.3 and decode_hot < decode_herd - 0.8
    assert prefill_fresh < prefill_herd - 0.3 and decode_fresh < 1.5


def _requests(n: int, seed: int = 0) -> list[SimRequest]:
    source = template_source(load_profile(PROFILE), seed)
    return [source() for _ in range(n)]


def test_replicas_take_requests_round_robin_and_converge_after_a_report() -> None:
    cluster = SimCluster(load_profile(PROFILE), "2P/4D", seed=1, views=STALE)
    batch = _requests(12)
    cluster.submit_many(batch)
    truth = cluster.views.truth("decode")
    # Before any report each replica sees only what it routed itself: requests k, k+4, k+8.
    for k, replica in enumerate(cluster.routers):
        mine = {r.request_id for r in batch[k::4]}
        held = {r.request_id for r in batch if replica.decode.loads.reservation(r.request_id)}
        assert held == mine
        assert sum(replica.decode.loads.requests) == 3
    assert sum(truth.requests) == 12
    # The report taken at 0.25 s arrives at 0.30 s; nothing finished or was routed in between
    # (a request decodes for ~2 s), so every replica now sees the truth, and counts it once.
    cluster.loop.run(0.26)
    assert sum(cluster.routers[1].decode.loads.requests) == 3
    cluster.loop.run(0.31)
    for replica in cluster.routers:
        assert replica.decode.loads.requests == truth.requests
        assert replica.decode.loads.decode_blocks == truth.decode_blocks
        assert len(replica.decode.loads) == 0  # its own reservations were in the snapshot


def test_no_double_counting_once_everything_finished() -> None:
    profile = load_profile(PROFILE)
    cluster = SimCluster(profile, "2P/4D", seed=2, views=STALE)
    ClosedLoop(cluster, template_source(profile, 2), [Phase(3.0, 64, ramp=0.5)])
    finished: list[float] = []
    cluster.completion_listeners.append(lambda rec: finished.append(cluster.now))
    cluster.loop.run()  # the report ticker stops by itself once the truth is empty
    assert cluster.loop.pending == 0
    assert len(finished) == len(cluster.records) > 100
    assert all(r.status == "ok" for r in cluster.records)
    for replica in cluster.routers:
        for router, n in ((replica.decode, 4), (replica.prefill, 2)):
            assert router.loads.prefill_tokens == [0] * n
            assert router.loads.decode_blocks == [0] * n
            assert router.loads.requests == [0] * n
            assert len(router.loads) == 0
    # The last zero report came after the last completion, at most a period and a delay later.
    last_report = math.ceil(max(finished) / 0.25) * 0.25 + 0.05
    assert cluster.now == pytest.approx(last_report)


def test_exact_load_with_replicas_shows_every_request_to_every_replica() -> None:
    cluster = SimCluster(load_profile(PROFILE), "2P/4D", seed=0, views=ViewSettings(replicas=3))
    cluster.submit_many(_requests(9))
    for replica in cluster.routers:
        assert sum(replica.decode.loads.requests) == 9
        assert sum(replica.prefill.loads.requests) == 9
    cluster.loop.run()
    for replica in cluster.routers:
        assert len(replica.decode.loads) == len(replica.prefill.loads) == 0
        assert sum(replica.decode.loads.decode_blocks) == 0


def test_kv_events_reach_every_replica_late() -> None:
    views = ViewSettings(replicas=2, delay_s=0.05)
    cluster = SimCluster(load_profile(PROFILE), "1P/2D", seed=0, views=views)
    cluster.submit(_requests(1)[0])
    cluster.loop.run(0.001)  # the prefill worker has admitted the prompt: its blocks are stored
    assert cluster.prefill[0].cache.cached_blocks > 0
    assert all(r.prefill.index.cached_blocks(0) == 0 for r in cluster.routers)
    cluster.loop.run(0.051)
    blocks = cluster.prefill[0].cache.cached_blocks
    assert all(r.prefill.index.cached_blocks(0) == blocks for r in cluster.routers)


def test_set_policy_reaches_every_router_of_every_replica() -> None:
    profile = load_profile(PROFILE)
    start = Policy(0.3, 0.5, 2)
    cluster = SimCluster(profile, "2P/4D", policy=start, views=ViewSettings(replicas=3))
    routers = [r.router(role) for r in cluster.routers for role in ("decode", "prefill")]
    assert len(routers) == 6 and all(r.policy == start for r in routers)
    cluster.set_policy(Policy(0.7, 0.2, 4))
    assert cluster.policy == Policy(0.7, 0.2, 4)
    assert all(r.policy == Policy(0.7, 0.2, 4) for r in routers)
    with pytest.raises(ValueError, match="tau"):
        cluster.set_policy(Policy(-1.0, 0.2, 5))
    assert all(r.policy.version == 4 for r in routers)  # a bad policy changes nothing
    records = cluster.submit_many(_requests(6))
    assert all(rec.decision.policy_version == 4 for rec in records)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"replicas": 0}, "replicas"),
        ({"replicas": 65}, "replicas"),
        ({"replicas": True}, "replicas"),
        ({"replicas": 2.0}, "replicas"),
        ({"delay_s": -0.1}, "delay_s"),
        ({"delay_s": math.nan}, "delay_s"),
        ({"delay_s": math.inf}, "delay_s"),
        ({"delay_s": 10.5}, "delay_s"),
        ({"delay_s": "0.1"}, "delay_s"),
        ({"routing": {"report_period_s": 0.25}}, "routing"),
    ],
)
def test_bad_view_settings_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ViewSettings(**kwargs)


@pytest.mark.parametrize("period", [-1.0, 0.0, math.nan, 11])
def test_a_bad_report_period_is_refused_by_the_service_s_own_model(period: float) -> None:
    with pytest.raises(ValueError, match="report_period_s"):
        ViewSettings.stale(2, period, 0.01)


def test_a_simulated_case_is_a_deployable_serve_config() -> None:
    from cluster.config import ServeConfig

    views = ViewSettings.stale(replicas=4, report_period_s=0.25, delay_s=0.01)
    assert views.report_period_s == 0.25 and not views.exact_load
    config = ServeConfig.model_validate(views.serve_config())
    assert config.ingress_replicas == 4 and config.routing == views.routing
    assert ServeConfig.model_validate(ViewSettings().serve_config()).ingress_replicas == 1
