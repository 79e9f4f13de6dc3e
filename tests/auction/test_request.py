from __future__ import annotations

import math

import numpy as np
import pytest

from auction import MAX_BID, Request, build_radix_tree, run_auction, vcg_payments, welfare


@pytest.mark.parametrize(
    ("bid", "match"),
    [(-1.0, "bid must be >= 0"), (math.nan, "finite"), (math.inf, "finite"), ("3", "number")],
)
def test_bad_bids_name_the_request(bid, match) -> None:
    with pytest.raises(ValueError, match=rf"request 'r7'.*{match}"):
        Request("r7", "u", [1, 2], bid)


@pytest.mark.parametrize(
    ("tokens", "match"),
    [([], "empty token list"), ([1.5, 2.0], "integers"), (["a"], "integers"),
     ([1, -2], r"\[0, 2\*\*32\)"), ([[1, 2]], "flat"), ([2**40], r"\[0, 2\*\*32\)")],
)
def test_bad_tokens_name_the_request(tokens, match) -> None:
    with pytest.raises(ValueError, match=rf"request 'q1'.*{match}"):
        Request("q1", "u", tokens, 1.0)


def test_duplicate_ids_are_named() -> None:
    batch = [Request("a", "u", [1], 1.0), Request("a", "v", [2], 1.0), Request("b", "u", [3], 1.0)]
    with pytest.raises(ValueError, match="duplicate request ids in batch: 'a'"):
        run_auction(batch)


def test_tokens_are_copied_and_frozen() -> None:
    source = np.array([1, 2, 3], dtype=np.uint32)
    request = Request("a", "u", source, 1.0)
    source[0] = 99
    assert request.token_array.tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        request.token_array[0] = 5


def test_empty_and_single_batches_are_valid() -> None:
    empty = run_auction([])
    assert empty.order == () and empty.welfare == 0.0 and empty.payments == {}
    one = run_auction([Request("a", "u", [1], 4.0)])
    assert one.order == ("a",) and one.welfare == 0.0 and one.payments == {"u": 0.0}


def test_max_bid_is_exported_and_bounds_every_bid() -> None:
    assert MAX_BID == 1e9
    assert Request("top", "u", [1], MAX_BID).bid == MAX_BID
    assert Request("int", "u", [1], 10**9).bid == MAX_BID  # an int at the bound is a bid too
    for bid in (1e308, MAX_BID * (1 + 2**-52), 10**400, np.float64(2e9)):
        with pytest.raises(ValueError, match=r"request 'r9'.*bid must be <= MAX_BID = 1e\+09"):
            Request("r9", "u", [1], bid)


@pytest.mark.parametrize(
    ("bids", "message"),
    [
        ([1.0, 1e308], r"bids must be finite and in \[0, MAX_BID = 1e\+09\]: request 'b' is 1e"),
        ([math.inf, 1.0], r"request 'a' is inf"),
        ([1.0, math.nan], r"request 'b' is nan"),
        ([-1.0, 1.0], r"request 'a' is -1\.0"),
        ([1.0], "expected 2 bids"),
        (["x", 1.0], "bids must be numbers"),
    ],
)
def test_bid_arrays_meet_the_same_bound_naming_the_request(
    bids: list[object], message: str
) -> None:
    tree = build_radix_tree([Request("a", "u", [1, 2], 1.0), Request("b", "v", [1, 3], 1.0)])
    with pytest.raises(ValueError, match=message):
        vcg_payments(tree, bids)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("order", "bids", "message"),
    [
        ([0, 1], [1.0, math.inf], r"bids\[1\] is inf"),
        ([0, 1], [1e308, 1.0], r"bids\[0\] is 1e\+308"),
        ([0, 0], [1.0, 1.0], "order must be a permutation of 0..1"),
        ([0, 2], [1.0, 1.0], "order must be a permutation of 0..1"),
        ([0.0, 1.0], [1.0, 1.0], "order must be a flat sequence of request indices"),
        ([0, 1, 2], [1.0, 1.0], "order serves 3 requests, bids has 2"),
    ],
)
def test_welfare_refuses_unbounded_bids_and_non_orders(
    order: list[object], bids: list[float], message: str
) -> None:
    # welfare([0, 1], [1, inf]) used to be 1·1 + inf·0 = nan.
    with pytest.raises(ValueError, match=message):
        welfare(order, bids)
