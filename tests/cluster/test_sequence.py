"""Sequence tracking (cluster.sequence): the counts stay true on honest streams and bounded on
dishonest ones; a late join, a restart or one absurd number never poisons what follows."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.sequence import MAX_GAP, WINDOW, SequenceTracker

S = ("pub", "route")


def _run(tracker: SequenceTracker, seqs: list[int], stream: object = S) -> list[bool]:
    return [tracker.observe(stream, s).deliver for s in seqs]


# A received stream: any start (a late join), increasing, with losses between messages.
_streams = st.tuples(
    st.integers(min_value=0, max_value=2**31),
    st.lists(st.integers(min_value=1, max_value=50), max_size=60),
).map(lambda p: [p[0] + sum(p[1][:i]) for i in range(len(p[1]) + 1)])


def _true_lost(seqs: list[int]) -> int:
    return sum(b - a - 1 for a, b in itertools.pairwise(seqs))


def test_one_absurd_number_does_not_poison_the_stream() -> None:
    # Regression: seq = 2**62 added 4.6e18 to the gaps and dropped every later real message.
    tracker = SequenceTracker()
    delivered = _run(tracker, [1, 2, 3, 2**62, 4, 5, 6])
    assert delivered == [True] * 7  # the odd one is delivered: it is a valid event
    assert (tracker.lost, tracker.duplicates, tracker.last_seen(S)) == (0, 0, 6)


def test_a_late_subscriber_counts_nothing_before_it() -> None:
    tracker = SequenceTracker()
    assert _run(tracker, [1_000_000, 1_000_001, 1_000_003]) == [True] * 3
    assert tracker.lost == 1


def test_a_restarted_publisher_resynchronises() -> None:
    tracker = SequenceTracker()
    _run(tracker, list(range(1, 501)))
    assert _run(tracker, [1, 2, 3]) == [True] * 3  # same id, numbering from 1 again
    assert (tracker.lost, tracker.duplicates, tracker.resyncs, tracker.last_seen(S)) == (0, 0, 1, 3)
    assert _run(tracker, [0, 1, 2]) == [True] * 3  # or from 0
    assert tracker.last_seen(S) == 2


def test_a_jump_beyond_the_bound_is_a_restart_not_a_loss() -> None:
    tracker = SequenceTracker(max_gap=1000)
    _run(tracker, [1, 2, 3])
    assert _run(tracker, [50_000, 50_001, 50_003]) == [True] * 3
    assert (tracker.lost, tracker.resyncs) == (1, 1)


def test_duplicates_are_dropped_and_counted() -> None:
    tracker = SequenceTracker()
    assert _run(tracker, [1, 2, 3, 3, 2, 4, 4]) == [True, True, True, False, False, True, False]
    assert (tracker.duplicates, tracker.lost) == (3, 0)


def test_settings_are_checked() -> None:
    for bad in ({"max_gap": 0}, {"window": -1}, {"max_streams": 1.5}):
        with pytest.raises(ValueError):
            SequenceTracker(**bad)  # type: ignore[arg-type]


@given(_streams)
def test_honest_streams_are_counted_exactly(seqs: list[int]) -> None:
    tracker = SequenceTracker()
    assert all(_run(tracker, seqs))
    assert (tracker.lost, tracker.duplicates, tracker.probes) == (_true_lost(seqs), 0, 0)
    assert tracker.last_seen(S) == seqs[-1]


@given(_streams, st.data())
def test_recent_duplicates_are_dropped_exactly(seqs: list[int], data: st.DataObject) -> None:
    tracker = SequenceTracker()
    delivered, duplicates = [], 0
    for i, seq in enumerate(seqs):
        verdict = tracker.observe(S, seq)
        assert verdict.deliver
        delivered.append(seq)
        repeats = data.draw(st.lists(st.integers(0, i), max_size=2))
        for j in repeats:
            again = seqs[j]
            if again > 1 and seq - again < WINDOW:  # 0 and 1 read as a restart: see the module
                assert not tracker.observe(S, again).deliver
                duplicates += 1
    assert delivered == seqs
    assert (tracker.lost, tracker.duplicates) == (_true_lost(seqs), duplicates)


@given(_streams, st.integers(min_value=0, max_value=2**63 - 1), st.data())
def test_one_garbage_number_costs_at_most_one_bounded_error(
    seqs: list[int], garbage: int, data: st.DataObject
) -> None:
    if garbage in seqs:
        return  # a real number arriving early is a genuine duplicate later, not garbage
    at = data.draw(st.integers(0, len(seqs)))
    tracker = SequenceTracker()
    real = [tracker.observe(S, s).deliver for s in seqs[:at]]
    tracker.observe(S, garbage)
    real += [tracker.observe(S, s).deliver for s in seqs[at:]]
    assert all(real)  # no real message is ever dropped
    assert tracker.duplicates == 0
    assert tracker.lost <= _true_lost(seqs) + MAX_GAP
    if at > 0 and not seqs[at - 1] - WINDOW < garbage <= seqs[at - 1] + MAX_GAP:
        assert tracker.lost == _true_lost(seqs)  # far garbage is not counted at all


@given(_streams, st.sampled_from([0, 1]), st.lists(st.integers(1, 50), max_size=30))
def test_restarts_deliver_the_new_stream(first: list[int], start: int, steps: list[int]) -> None:
    if first[-1] <= start:
        return  # indistinguishable from a duplicate of the only message
    second = [start + sum(steps[:i]) for i in range(len(steps) + 1)]
    tracker = SequenceTracker()
    _run(tracker, first)
    assert all(_run(tracker, second))
    assert tracker.duplicates == 0


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 2**64)), max_size=300))
def test_any_input_keeps_every_count_bounded(messages: list[tuple[int, int]]) -> None:
    tracker = SequenceTracker(max_streams=8, window=64, max_gap=1000)
    for stream, seq in messages:
        verdict = tracker.observe(stream, seq)
        assert 0 <= verdict.lost <= 1000
        assert verdict.deliver or verdict.outcome == "duplicate"
    assert len(tracker) <= 8
    assert all(s.seen < 2**64 for s in tracker._streams.values())
