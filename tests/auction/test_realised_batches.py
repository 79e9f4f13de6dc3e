"""Realised welfare of live batches (auction/realised.py): a batch completes when every request
has its first token or ended; one that never started ranks last; memory stays bounded."""

from __future__ import annotations

import pytest

from auction.realised import RealisedWelfare
from auction.welfare import realised_welfare

BIDS = {"a": 3.0, "b": 1.0, "c": 2.0}
ARRIVED = {"a": 0.0, "b": 0.0, "c": 0.5}


def test_a_batch_completes_on_its_last_first_token_with_the_ttft_order() -> None:
    tracker = RealisedWelfare()
    tracker.batch(7, ["a", "b", "c"], BIDS, ARRIVED, planned=4.0)
    assert tracker.first_token("c", 1.0) is None  # TTFT 0.5
    assert tracker.first_token("a", 0.2) is None  # TTFT 0.2
    assert tracker.first_token("a", 9.0) is None  # a duplicate changes nothing
    done = tracker.first_token("b", 3.0)  # TTFT 3.0: order a, c, b
    assert done is not None and (done.number, done.planned) == (7, 4.0)
    assert done.realised == pytest.approx(realised_welfare([3.0, 1.0, 2.0], [0.2, 3.0, 0.5]))
    assert done.realised == pytest.approx(4.0)  # x = 1, 0, ½
    assert tracker.first_token("b", 4.0) is None  # the batch is gone


def test_a_request_that_never_started_ranks_last() -> None:
    tracker = RealisedWelfare()
    tracker.batch(1, ["a", "b", "c"], BIDS, ARRIVED, planned=4.0)
    tracker.ended("a")  # the biggest bid, never served
    tracker.first_token("b", 0.1)
    done = tracker.first_token("c", 0.7)
    assert done is not None
    assert done.realised == pytest.approx(1.0 * 1 + 2.0 * 0.5 + 3.0 * 0)


def test_unknown_requests_are_ignored_and_open_batches_are_bounded() -> None:
    tracker = RealisedWelfare(max_open=2)
    assert tracker.first_token("nobody", 1.0) is None and tracker.ended("nobody") is None
    for k in range(3):
        tracker.batch(k, [f"r{k}"], {f"r{k}": 1.0}, {f"r{k}": 0.0}, planned=0.0)
    assert tracker.dropped == 1 and tracker.first_token("r0", 1.0) is None
    done = tracker.first_token("r2", 1.0)
    assert done is not None and done.realised == 0.0  # one request: no order to speak of
    with pytest.raises(ValueError, match="max_open"):
        RealisedWelfare(0)
    with pytest.raises(ValueError, match="no bid or arrival"):
        tracker.batch(9, ["x"], {}, {}, planned=0.0)
