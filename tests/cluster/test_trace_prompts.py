"""Prompts from trace block ids (cluster/traces/prompts.py): deterministic token blocks, prefixes
shared exactly as the ids say, and the router's own hashes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.model_dir import word_token_ids
from cluster.traces import PrefixGroups, TracePrompts, TraceRequest, parse_sharing
from router import block_hashes, sequence_hashes


def _request(index: int, n: int, ids: tuple[int, ...] | None) -> TraceRequest:
    return TraceRequest(index, index + 1, 0.0, n, 8, ids)


def _ids(n: int, block: int, start: int) -> tuple[int, ...]:
    return tuple(range(start, start + -(-n // block)))


def test_tokens_are_the_blocks_tokens_in_order_and_cut_to_the_length() -> None:
    prompts = TracePrompts(512, seed=3)
    tokens = prompts.tokens(_request(0, 1200, (7, 8, 9)))
    assert tokens.dtype == np.uint32 and tokens.shape == (1200,)
    grid = prompts.block_token_ids([7, 8, 9], 512)
    assert np.array_equal(tokens, grid.reshape(-1)[:1200])
    alone = prompts.block_token_ids([8], 512)  # a block alone is the same block
    assert np.array_equal(alone[0], grid[1])
    space = word_token_ids()
    assert space.start <= int(tokens.min()) and int(tokens.max()) < space.stop


def test_equal_leading_ids_share_exactly_that_prefix() -> None:
    prompts = TracePrompts(512)
    a = prompts.tokens(_request(0, 1500, (1, 2, 3)))
    b = prompts.tokens(_request(1, 1500, (1, 2, 4)))
    c = prompts.tokens(_request(2, 1500, (5, 2, 3)))
    assert np.array_equal(a[:1024], b[:1024]) and not np.array_equal(a[1024:], b[1024:])
    assert not np.array_equal(a[:512], c[:512])
    agree = np.nonzero(a != b)[0][0]  # the first token that differs: inside block 3
    assert 1024 <= agree < 1040


def test_seeds_give_other_tokens_and_the_same_seed_the_same() -> None:
    req = _request(0, 600, (1, 2))
    one, again, other = (TracePrompts(512, seed=s).tokens(req) for s in (1, 1, 2))
    assert np.array_equal(one, again) and not np.array_equal(one, other)


@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=6),
    shared=st.integers(0, 3),
    block_size=st.sampled_from([16, 32, 48, 64, 512]),
    block_tokens=st.sampled_from([64, 512]),
)
def test_the_hashes_are_the_routers_own(
    lengths: list[int], shared: int, block_size: int, block_tokens: int
) -> None:
    """Whatever the cache has seen before, a prompt's hashes equal hashing its tokens whole
    (48 does not divide 512: the prompt is then hashed whole)."""
    prompts = TracePrompts(block_tokens, seed=1, cache_blocks=8)
    for k, n in enumerate(lengths):
        blocks = -(-n // block_tokens)
        ids = tuple(range(min(shared, blocks))) + _ids(n, block_tokens, 100 * (k + 1))
        req = _request(k, n, ids[:blocks])
        tokens, hashes = prompts.prompt(req, block_size)
        local = block_hashes(tokens, block_size)
        assert hashes.block_size == block_size and hashes.local == local
        assert hashes.seq == sequence_hashes(local)
        assert np.array_equal(tokens, prompts.tokens(req))


def test_rows_without_ids_get_unique_prompts() -> None:
    prompts = TracePrompts(None, seed=0)
    a = prompts.tokens(_request(0, 2048, None))
    b = prompts.tokens(_request(1, 2048, None))
    assert a.shape == (2048,) and not np.array_equal(a[:16], b[:16])
    with pytest.raises(ValueError, match="block_tokens is needed"):
        prompts.tokens(_request(2, 512, (1,)))


def test_prefix_groups_share_whole_blocks_within_a_group() -> None:
    prompts = TracePrompts(None, seed=0, sharing=PrefixGroups(0.5, 2))
    reqs = [_request(k, 2048, None) for k in range(12)]
    keys = [prompts.blocks(r)[0] for r in reqs]
    groups: dict[int, list[list[int]]] = {}
    for k in keys:
        groups.setdefault(k[0], []).append(k)
    assert len(groups) == 2  # each request joined one of the two groups
    for members in groups.values():
        assert all(m[:2] == members[0][:2] for m in members)  # ⌊0.5·2048 / 512⌋ = 2 blocks
        assert len({tuple(m[2:]) for m in members}) == len(members)  # the rest its own
    tokens = [prompts.tokens(r) for r in reqs]
    same = [i for i in range(1, 12) if keys[i][0] == keys[0][0]]
    assert np.array_equal(tokens[0][:1024], tokens[same[0]][:1024])


def test_sharing_models_by_name() -> None:
    assert parse_sharing(None) is None and parse_sharing("none") is None
    assert parse_sharing("prefix-groups:0.25:8") == PrefixGroups(0.25, 8)
    assert PrefixGroups(0.25, 8).name == "prefix-groups:0.25:8"
    for bad in ("prefix", "prefix-groups:2:3", "prefix-groups:0.5:0", "groups:0.5:2"):
        with pytest.raises(ValueError, match="prefix-groups"):
            parse_sharing(bad)


def test_the_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="block_tokens"):
        TracePrompts(0)
    with pytest.raises(ValueError, match="seed"):
        TracePrompts(512, seed=-1)
    with pytest.raises(ValueError, match="token_space"):
        TracePrompts(512, token_space=range(5, 6))
