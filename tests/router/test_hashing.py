"""Block hashing must equal Dynamo's byte for byte (docs/design.md §2)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from router import XXH3_SEED, block_hashes, next_sequence_hash, sequence_hashes, token_bytes

TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=80)


# -- local block hashes (Dynamo's tokens_hash) ----------------------------------------------


def test_design_test_vectors() -> None:
    # docs/design.md §2, checked against ai-dynamo 1.6.1's compute_block_hash_for_seq.
    assert block_hashes(list(range(40)), 16) == [15310707395893867146, 15292316782987903195]
    assert block_hashes([5] * 16) == [9340675565616011363]


def test_partial_tail_is_not_hashed() -> None:
    assert block_hashes([]) == []
    assert block_hashes(list(range(15))) == []
    assert block_hashes(list(range(31))) == block_hashes(list(range(16)))
    assert len(block_hashes(list(range(64)), block_size=4)) == 16


@settings(max_examples=60)
@given(TOKENS, st.sampled_from([1, 4, 16, 64]))
def test_each_block_is_xxh3_1337_over_little_endian_u32(tokens: list[int], size: int) -> None:
    # lib/llm/src/kv_router/protocols.rs, compute_block_hash_for_seq: chunks_exact(B), each
    # token's u32 to_le_bytes, xxh3_64_with_seed(bytes, 1337); independent of the parent.
    expected = [
        xxhash.xxh3_64_intdigest(struct.pack(f"<{size}I", *tokens[i : i + size]), seed=1337)
        for i in range(0, len(tokens) - size + 1, size)
    ]
    assert block_hashes(tokens, size) == expected
    assert block_hashes(np.array(tokens, dtype=np.uint32), size) == expected
    assert block_hashes(np.array(tokens, dtype=np.int64), size) == expected


def test_local_hash_ignores_the_parent() -> None:
    a, b, c = [1] * 16, [2] * 16, [3] * 16
    assert block_hashes(a + b)[1] == block_hashes(c + b)[1] == block_hashes(b)[0]


def test_largest_token_id() -> None:
    assert block_hashes([2**32 - 1] * 16) == [9046446989928805549]
    assert token_bytes([2**32 - 1]) == b"\xff\xff\xff\xff"
    assert token_bytes([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"


@pytest.mark.parametrize(
    "tokens", [[-1], [2**32], [1.5], ["a"], np.array([[1, 2]]), np.array([1.0]), np.array([-3])]
)
def test_bad_tokens_raise_value_error(tokens: object) -> None:
    with pytest.raises(ValueError):
        block_hashes(tokens)  # type: ignore[arg-type]


def test_bad_block_size_raises() -> None:
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3], block_size=0)


# -- chained sequence hashes (Dynamo's SequenceHash) ----------------------------------------


def test_sequence_hash_vectors() -> None:
    # Derived from compute_seq_hash_for_block (lib/llm/src/kv_router/protocols.rs, later
    # lib/kv-router/src/protocols.rs via dynamo_tokens::compute_next_sequence_hash):
    # seq[0] = local[0]; seq[i] = xxh3_64_with_seed(le_u64(seq[i-1]) ++ le_u64(local[i]), 1337).
    local = block_hashes(list(range(64)))
    assert local == [
        15310707395893867146,
        15292316782987903195,
        5532946206955930018,
        14928757266181269122,
    ]
    assert sequence_hashes(local) == [
        15310707395893867146,
        13769157705258532664,
        11879827756109914528,
        3888788807566526800,
    ]


@settings(max_examples=40)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=12))
def test_sequence_hash_chain(local: list[int]) -> None:
    seq = sequence_hashes(local)
    assert len(seq) == len(local)
    parent = None
    for h, s in zip(local, seq, strict=True):
        if parent is None:
            assert s == h
        else:
            packed = parent.to_bytes(8, "little") + h.to_bytes(8, "little")
            assert s == xxhash.xxh3_64_intdigest(packed, seed=XXH3_SEED)
            assert s == next_sequence_hash(parent, h)
        parent = s


def test_sequence_hash_covers_the_parent() -> None:
    a, b, c = [1] * 16, [2] * 16, [3] * 16
    assert block_hashes(a + b)[1] == block_hashes(c + b)[1]
    assert sequence_hashes(block_hashes(a + b))[1] != sequence_hashes(block_hashes(c + b))[1]
    assert sequence_hashes([]) == []
