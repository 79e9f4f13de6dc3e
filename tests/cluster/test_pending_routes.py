"""Who waits, in serve mode (cluster/ray/pending_routes.py): routed requests without a first
token, and the drain reading built on them."""

from __future__ import annotations

import pytest

from cluster.ray.pending_routes import PendingRoutes


def test_the_oldest_open_request_sets_the_wait() -> None:
    pending = PendingRoutes()
    assert pending.oldest_wait_s(5.0) == 0.0  # nobody waits
    for i, t in enumerate((1.0, 2.0, 3.0)):
        pending.routed(f"r{i}", t)
    assert pending.oldest_wait_s(4.0) == 3.0
    pending.answered("r0")  # its first token
    pending.answered("nobody")  # an unknown id changes nothing
    assert pending.oldest_wait_s(4.0) == 2.0 and len(pending) == 2
    pending.routed("r1", 3.5)  # routed again (a retry): it waits from then
    assert pending.oldest_wait_s(4.0) == 1.0
    pending.ended("r2")  # failed before its first token
    assert pending.oldest_wait_s(4.0) == 0.5 and not pending.idle(4.0)  # r0 and r1 still fly
    pending.ended("r0"), pending.ended("r1")
    assert pending.idle(4.0) and pending.oldest_wait_s(4.0) == 0.0


def test_lost_closes_are_forgotten_past_the_horizon_and_the_size_is_bounded() -> None:
    pending = PendingRoutes(horizon_s=10.0, max_open=3)
    pending.routed("lost", 0.0)
    pending.routed("live", 5.0)
    assert pending.oldest_wait_s(10.0) == 10.0
    assert pending.oldest_wait_s(10.5) == 5.5 and pending.forgotten == 1
    assert not pending.idle(10.5) and pending.forgotten == 2  # "lost" flew too: forgotten there
    for i in range(4):
        pending.routed(f"n{i}", 11.0)
    assert len(pending) == 3 and pending.forgotten == 6  # "live" and n0 went, in both books
    with pytest.raises(ValueError, match="horizon_s"):
        PendingRoutes(horizon_s=0.0)
    with pytest.raises(ValueError, match="max_open"):
        PendingRoutes(max_open=0)
