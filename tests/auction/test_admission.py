"""The admission queue's release rule and payment shares (auction/admission.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auction import Request, run_auction
from auction.admission import (
    AdmissionQueue,
    AuctionSettings,
    QueueFull,
    Release,
    split_payments,
)

WINDOW = AuctionSettings().batch_window_s


def _queue(**overrides: object) -> AdmissionQueue:
    return AdmissionQueue(AuctionSettings(**overrides), batch_prefix="b")  # type: ignore[arg-type]


def _ids(releases: list[Release]) -> list[str]:
    return [r.request_id for r in releases]


# Prompts with shared prefixes, so dfs-bid's order differs from a plain bid sort.
PROMPTS = {
    "a": [1, 2, 3],
    "b": [1, 2, 4],
    "c": [7, 8],
    "d": [1, 9],
    "e": [7, 5],
}
BIDS = {"a": 1.0, "b": 4.0, "c": 3.0, "d": 0.5, "e": 2.0}
USERS = {"a": "u1", "b": "u2", "c": "u1", "d": "u3", "e": "u2"}


def _fill(queue: AdmissionQueue, ids: str, now: float = 0.0) -> None:
    for rid in ids:
        queue.enqueue(rid, USERS[rid], BIDS[rid], PROMPTS[rid], now)


def test_fcfs_pass_through_below_saturation() -> None:
    queue = _queue(max_in_prefill=2)
    _fill(queue, "abc")
    releases = queue.releasable(0.0)
    assert releases == [Release("a", 0, 0.0, None, "fcfs"), Release("b", 0, 0.0, None, "fcfs")]
    assert queue.depth == 1 and queue.in_prefill == 2
    assert queue.releasable(0.0) == []  # both slots taken
    queue.slot_freed("a")
    queue.slot_freed("a")  # idempotent
    assert _ids(queue.releasable(0.0)) == ["c"]
    assert queue.batches == 0 and queue.pop_batches() == []
    assert queue.next_deadline() is None  # FCFS never waits for a window


def test_saturated_regime_auctions_a_full_batch_in_dfs_bid_order_with_vcg_shares() -> None:
    queue = _queue(batch_size=5)
    queue.set_regime("saturated")
    _fill(queue, "abcd")
    assert queue.releasable(0.0) == []  # 4 < batch_size and the window is still open
    assert queue.next_deadline() == pytest.approx(WINDOW)
    _fill(queue, "e")
    releases = queue.releasable(0.0)  # batch_size reached: no waiting for the window
    batch = [Request(r, USERS[r], PROMPTS[r], BIDS[r], arrival=k) for k, r in enumerate("abcde")]
    expected = run_auction(batch, "dfs-bid")
    assert tuple(_ids(releases)) == expected.order
    assert [r.position for r in releases] == [1, 2, 3, 4, 5]
    assert {r.mode for r in releases} == {"auction"} and {r.batch_id for r in releases} == {"b-0"}
    shares = {r.request_id: r.payment for r in releases}
    assert shares == split_payments(expected.payments, batch)
    for user, paid in expected.payments.items():  # the users' shares add up to their VCG price
        owned = [r for r in "abcde" if USERS[r] == user]
        assert sum(shares[r] for r in owned) == pytest.approx(paid)
        assert all(shares[r] <= BIDS[r] for r in owned)
    assert expected.revenue > 0  # the test exercises real payments
    (outcome,) = queue.pop_batches()
    assert (outcome.number, outcome.batch_id, outcome.order) == (0, "b-0", expected.order)
    assert outcome.welfare == expected.welfare and outcome.revenue == expected.revenue


def test_a_long_queue_is_auctioned_even_below_saturation() -> None:
    queue = _queue(max_in_prefill=1, queue_threshold=3, batch_size=2)
    _fill(queue, "a")
    assert _ids(queue.releasable(0.0)) == ["a"]  # FCFS while nothing queues
    _fill(queue, "bcd")  # slot taken: three wait, depth 3 >= queue_threshold
    assert not queue.fcfs and queue.releasable(0.0) == []
    queue.slot_freed("a")
    (first,) = queue.releasable(0.0)  # a batch of the oldest two (b, c) by bid: b first
    assert (first.request_id, first.mode, first.position) == ("b", "auction", 1)
    assert queue.depth == 2  # c (pending in the batch) and d (not auctioned yet)
    queue.slot_freed("b")
    assert queue.fcfs  # depth 2 < 3 again, but the pending batch still leaves first, in order
    assert queue.releasable(0.0) == [Release("c", 2, first_share(queue, "c"), "b-0", "auction")]
    queue.slot_freed("c")
    assert queue.releasable(0.0) == [Release("d", 0, 0.0, None, "fcfs")]


def first_share(queue: AdmissionQueue, rid: str) -> float:
    return queue.pop_batches()[0].shares[rid]


def test_the_batch_window_releases_a_partial_batch() -> None:
    queue = _queue(batch_size=32, batch_window_ms=50.0)
    queue.set_regime("transition")
    _fill(queue, "ab", now=10.0)
    _fill(queue, "c", now=10.03)
    assert queue.releasable(10.049) == []
    assert queue.next_deadline() == pytest.approx(10.05)
    releases = queue.releasable(10.05)
    assert sorted(_ids(releases)) == ["a", "b", "c"] and releases[0].batch_id == "b-0"
    assert queue.next_deadline() is None
    with pytest.raises(ValueError, match="regime"):
        queue.set_regime("panic")


@given(arrived=st.floats(0.0, 1e6), window_ms=st.floats(0.0, 60_000.0))
def test_a_wake_up_at_the_deadline_finds_the_batch_due(arrived: float, window_ms: float) -> None:
    """A caller that sleeps until ``next_deadline`` and calls ``releasable`` then must get the
    batch, whatever the rounding of arrival + window (else it would wake forever)."""
    queue = _queue(batch_size=32, batch_window_ms=window_ms)
    queue.set_regime("saturated")
    _fill(queue, "a", now=arrived)
    deadline = queue.next_deadline()
    assert deadline is not None
    assert _ids(queue.releasable(deadline)) == ["a"] and queue.next_deadline() is None


def test_slots_bound_what_is_released_without_a_first_token() -> None:
    queue = _queue(batch_size=4, max_in_prefill=2)
    queue.set_regime("saturated")
    _fill(queue, "abcd")
    first = queue.releasable(0.0)
    assert len(first) == 2 and queue.in_prefill == 2 and queue.depth == 2
    assert queue.next_deadline() is None  # waiting on slots, not on a clock
    assert queue.releasable(100.0) == []
    queue.slot_freed(first[0].request_id)
    (third,) = queue.releasable(100.0)
    assert third.position == 3
    # A cancelled request leaves its batch; the others keep their positions.
    fourth = next(r for r in "abcd" if r not in {*_ids(first), third.request_id})
    assert queue.cancel(fourth) and not queue.cancel(fourth) and fourth not in queue
    queue.slot_freed(third.request_id)
    assert queue.releasable(100.0) == [] and queue.depth == 0


def test_max_queue_and_duplicates_are_refused() -> None:
    queue = _queue(max_queue=3, max_in_prefill=1)
    _fill(queue, "abc")  # nothing leaves before releasable(): all three wait
    with pytest.raises(QueueFull, match="full"):
        queue.enqueue("x", "u", 0.0, [1], 0.0)
    assert _ids(queue.releasable(0.0)) == ["a"]
    queue.enqueue("x", "u", 0.0, [1], 0.0)  # a released request no longer counts
    with pytest.raises(QueueFull):
        queue.enqueue("y", "u", 0.0, [1], 0.0)
    with pytest.raises(ValueError, match="already admitted"):
        queue.enqueue("a", "u", 0.0, [1], 0.0)  # in prefill
    with pytest.raises(ValueError, match="already admitted"):
        queue.enqueue("b", "u", 0.0, [1], 0.0)  # queued
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="bid"):
            queue.enqueue("z", "u", bad, [1], 0.0)
    with pytest.raises(ValueError, match="empty token list"):
        queue.enqueue("z", "u", 1.0, [], 0.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", 0),
        ("batch_size", 4097),
        ("batch_size", 2.0),
        ("batch_size", True),
        ("batch_window_ms", -1.0),
        ("batch_window_ms", math.nan),
        ("batch_window_ms", "50"),
        ("queue_threshold", -1),
        ("max_in_prefill", 0),
        ("max_queue", 0),
        ("scheduler", "random"),
    ],
)
def test_settings_are_validated(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field if field != "scheduler" else "scheduler"):
        AuctionSettings(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_prefix"):
        AdmissionQueue(AuctionSettings(), batch_prefix="")


def test_other_schedulers_order_but_charge_nothing() -> None:
    queue = _queue(scheduler="bid-sort", batch_size=5, queue_threshold=0)
    _fill(queue, "abcde")
    releases = queue.releasable(0.0)
    assert _ids(releases) == ["b", "c", "e", "a", "d"]
    assert all(r.payment == 0.0 for r in releases)


@given(
    st.lists(
        st.tuples(st.sampled_from(["u1", "u2", "u3"]), st.sampled_from([0.0, 0.5, 1.0, 7.0])),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 6),
)
@settings(max_examples=60, deadline=None)
def test_shares_are_within_bids_and_sum_to_the_vcg_payments(
    spec: list[tuple[str, float]], batch_size: int
) -> None:
    queue = _queue(batch_size=batch_size, queue_threshold=0, max_in_prefill=1000)
    for k, (user, bid) in enumerate(spec):
        queue.enqueue(f"r{k}", user, bid, [k % 3, k % 2, k], 0.0)
    releases = {r.request_id: r for r in queue.releasable(1.0)}
    assert len(releases) == len(spec)
    bids = {f"r{k}": bid for k, (_, bid) in enumerate(spec)}
    for outcome in queue.pop_batches():
        assert len(outcome.order) <= batch_size
        for user, paid in outcome.payments.items():
            mine = [r for r in outcome.order if spec[int(r[1:])][0] == user]
            assert sum(outcome.shares[r] for r in mine) == pytest.approx(paid, abs=1e-9)
        for rid in outcome.order:
            assert 0.0 <= releases[rid].payment <= bids[rid]
            assert releases[rid].payment == outcome.shares[rid]


def test_a_batch_reports_each_users_value_and_they_add_up_to_its_welfare() -> None:
    """V_i = Σ_{r∈R_i} b_r·x_r with x_r = (n − pos_r)/(n − 1), summed over users: W (§1)."""
    queue = _queue(batch_size=5, max_in_prefill=5)
    queue.set_regime("saturated")
    _fill(queue, "abcde")
    releases = queue.releasable(WINDOW)
    (outcome,) = queue.pop_batches()
    n = len(outcome.order)
    by_hand: dict[str, float] = {}
    for r in releases:
        user, x = USERS[r.request_id], (n - r.position) / (n - 1)
        by_hand[user] = by_hand.get(user, 0.0) + BIDS[r.request_id] * x
    assert outcome.user_welfare == pytest.approx(by_hand)
    assert sum(outcome.user_welfare.values()) == pytest.approx(outcome.welfare)


def test_a_batch_takes_the_paying_requests_first_then_fills_up_in_arrival_order() -> None:
    queue = _queue(batch_size=3, queue_threshold=0, max_in_prefill=1000)
    for k, bid in enumerate([0.0, 0.0, 2.0, 0.0, 1.0, 0.0]):
        queue.enqueue(f"r{k}", f"u{k}", bid, [k + 1], now=0.0)
    first = queue.releasable(now=1.0)  # the window has passed: both batches form in turn
    batches = queue.pop_batches()
    assert set(batches[0].order) == {"r2", "r4", "r0"}  # both bidders, then the oldest non-payer
    assert set(batches[1].order) == {"r1", "r3", "r5"}
    assert [r.request_id for r in first][:3] == list(batches[0].order)
