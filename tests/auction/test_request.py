from __future__ import annotations

import math

import numpy as np
import pytest

from auction import Request, run_auction


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
