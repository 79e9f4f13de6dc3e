"""Per-publisher sequence tracking for the event bus: gaps, duplicates and resynchronisation.

Each publisher numbers its messages per subject (docs/design.md §5); NATS keeps order within a
subscription, so a subscriber can prove what it missed. What it must not do is trust those
numbers blindly: one message with ``seq = 2**62`` once added 4.6e18 to the gap count and made
every later real message look like a duplicate. The rules here keep every count bounded:

- The first message seen on a stream (publisher, subject) sets the baseline: a subscriber that
  joins late, or forgot a stream, does not count what came before it as lost.
- ``seq = last + d`` with ``1 <= d <= max_gap``: delivered, ``d - 1`` counted as lost.
- A jump beyond ``max_gap``, or a step back to a number not delivered recently, or back to 0/1
  (a restarted publisher), is a *probe*: delivered, nothing counted, the old baseline kept. The
  next message decides: if it continues the old stream the probe was garbage (or a stray); if it
  continues the probe the publisher restarted, and the stream resynchronises there (a resync).
- ``seq <= last`` that was delivered within the last ``window`` numbers is a duplicate: dropped
  and counted.

Limits (documented defaults): ``max_gap = 100_000`` messages (a real loss larger than that in one
jump is recorded as a resync, not as lost messages; a garbage number within it can inflate the
lost count once, by at most ``max_gap``); ``window = 1024`` (duplicates older than that are
taken for a restart); ``max_streams = 4096`` tracked streams, least recently seen forgotten first
(a forgotten stream starts again from a fresh baseline). A publisher restarting under the same id
whose first message after the restart is lost is not recognised until it passes its old number:
the messages up to there look like duplicates. The bus gives each publisher a new id per start,
so this applies only to foreign publishers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

MAX_GAP = 100_000
WINDOW = 1024
MAX_STREAMS = 4096


class Verdict(NamedTuple):
    """What to do with one message: deliver it or not, and what it proves was lost."""

    deliver: bool
    lost: int
    outcome: str  # first | next | gap | duplicate | probe | resync


@dataclass
class _Stream:
    last: int
    seen: int  # bit k set: seq ``last - k`` was delivered (k < window)
    probe: int | None = None


class SequenceTracker:
    """Plain, synchronous and bounded in memory: O(max_streams × window bits)."""

    def __init__(
        self, *, max_gap: int = MAX_GAP, window: int = WINDOW, max_streams: int = MAX_STREAMS
    ) -> None:
        for name, value in (("max_gap", max_gap), ("window", window), ("max_streams", max_streams)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.max_gap = max_gap
        self.window = window
        self.max_streams = max_streams
        self._mask = (1 << window) - 1
        self._streams: OrderedDict[Hashable, _Stream] = OrderedDict()
        self.lost = 0
        self.duplicates = 0
        self.probes = 0
        self.resyncs = 0

    def __len__(self) -> int:
        return len(self._streams)

    def last_seen(self, stream: Hashable) -> int:
        """The baseline's highest delivered ``seq`` on ``stream`` (0: nothing yet)."""
        state = self._streams.get(stream)
        return 0 if state is None else state.last

    def observe(self, stream: Hashable, seq: int) -> Verdict:
        state = self._streams.get(stream)
        if state is None:
            self._streams[stream] = _Stream(seq, 1)
            if len(self._streams) > self.max_streams:
                self._streams.popitem(last=False)
            return Verdict(True, 0, "first")
        self._streams.move_to_end(stream)
        probe = state.probe
        if probe is not None:
            if seq == probe:
                return self._duplicate()
            if not state.last < seq <= state.last + self.max_gap and (
                probe < seq <= probe + self.max_gap
            ):
                # The probe was a restart: the stream goes on from there.
                state.last, state.seen = probe, 1
                self.resyncs += 1
                verdict = self._forward(state, seq)
                return Verdict(True, verdict.lost, "resync")
        if seq > state.last:
            if seq - state.last <= self.max_gap:
                return self._forward(state, seq)
            return self._probe(state, seq)
        back = state.last - seq
        restart = seq <= 1 and back > 0  # publishers number from 0 or 1
        if not restart and back < self.window and (state.seen >> back) & 1:
            return self._duplicate()
        return self._probe(state, seq)

    def _forward(self, state: _Stream, seq: int) -> Verdict:
        step = seq - state.last
        state.seen = 1 if step >= self.window else ((state.seen << step) | 1) & self._mask
        state.last, state.probe = seq, None
        self.lost += step - 1
        return Verdict(True, step - 1, "gap" if step > 1 else "next")

    def _probe(self, state: _Stream, seq: int) -> Verdict:
        # Delivered (the joiner downstream drops duplicate requests by id), counted as nothing
        # until the next message tells a restart from garbage.
        state.probe = seq
        self.probes += 1
        return Verdict(True, 0, "probe")

    def _duplicate(self) -> Verdict:
        self.duplicates += 1
        return Verdict(False, 0, "duplicate")
