"""Array helpers over contiguous runs (siblings grouped by parent, entries grouped by user)."""

from __future__ import annotations

import numpy as np

from auction.radix import FloatArray, IntArray


def run_starts(labels: IntArray) -> IntArray:
    """Index of the first element of each run of equal consecutive labels."""
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], labels[1:] != labels[:-1]))).astype(np.int64)


def run_start_of(labels: IntArray) -> IntArray:
    """For every element, the index where its run starts."""
    starts = run_starts(labels)
    lengths = np.diff(np.concatenate((starts, [labels.size])))
    return np.repeat(starts, lengths)


def exclusive_run_cumsum(values: FloatArray, labels: IntArray) -> FloatArray:
    """Σ of ``values`` over the earlier elements of each element's run.

    Accumulates in extended precision so that differences of large prefix sums keep the digits
    that VCG payments (small differences of large sums) need.
    """
    if values.size == 0:
        return np.zeros(0, dtype=np.float64)
    before = np.cumsum(values, dtype=np.longdouble) - values
    return np.asarray(before - before[run_start_of(labels)], dtype=np.float64)
