"""Block hashing compatible with Dynamo's KV router (docs/design.md §2).

A prompt is cut into fixed blocks of ``block_size`` tokens; a partial tail block is not hashed.
Two hashes exist per block, both XXH3-64 with seed ``XXH3_SEED`` = 1337:

- the *local block hash* (Dynamo's ``LocalBlockHash``, the ``tokens_hash`` of KV events)
  covers only the block's own tokens, packed as little-endian uint32 —
  ``local[i] = XXH3(le_u32(tokens[i*B:(i+1)*B]), 1337)``;
- the *sequence hash* (Dynamo's ``SequenceHash``) chains each block to its parent —
  ``seq[0] = local[0]``, ``seq[i] = XXH3(le_u64(seq[i-1]) ‖ le_u64(local[i]), 1337)``.

Sources read (ai-dynamo/dynamo): ``compute_block_hash_for_seq`` and
``compute_seq_hash_for_block`` in ``lib/llm/src/kv_router/protocols.rs`` (moved to
``lib/kv-router/src/protocols.rs`` later, where the chain step is
``dynamo_tokens::compute_next_sequence_hash``; same recurrence and seed). The router indexes
prefixes by local hashes; sequence hashes are what Dynamo's mocker publishes as ``block_hash``
and what its active-sequence tracking keys on. Newer Dynamo versions mix a LoRA name or cache
namespace into the seed, hence the ``seed`` parameter.

>>> block_hashes(list(range(40)))
[15310707395893867146, 15292316782987903195]
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import xxhash

XXH3_SEED: Final = 1337
DEFAULT_BLOCK_SIZE: Final = 16
U32_MAX: Final = 0xFFFF_FFFF
U64_MASK: Final = 0xFFFF_FFFF_FFFF_FFFF

Tokens = Sequence[int] | npt.NDArray[np.integer]

_xxh3 = xxhash.xxh3_64_intdigest
_pack_pair = struct.Struct("<QQ").pack


def token_bytes(tokens: Tokens) -> bytes:
    """The tokens as consecutive little-endian uint32 — the bytes Dynamo hashes.

    Raises ValueError for a token outside [0, 2**32).
    """
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError("tokens must be a 1-D integer array")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > U32_MAX):
            raise ValueError("token ids must lie in [0, 2**32)")
        return tokens.astype("<u4", copy=False).tobytes()
    try:
        # One C call both packs and range-checks every token.
        return struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error as err:
        raise ValueError(f"token ids must be integers in [0, 2**32): {err}") from None


def block_hashes(
    tokens: Tokens, block_size: int = DEFAULT_BLOCK_SIZE, seed: int = XXH3_SEED
) -> list[int]:
    """Dynamo's local block hashes (``tokens_hash``) of every complete block of ``tokens``.

    The tokens are packed once; each block is then hashed from a slice of that buffer, so the
    only per-block work is one XXH3 call.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    data = token_bytes(tokens)
    step = 4 * block_size
    end = (len(data) // step) * step
    return [_xxh3(data[i : i + step], seed) for i in range(0, end, step)]


def next_sequence_hash(parent: int, local: int, seed: int = XXH3_SEED) -> int:
    """One step of Dynamo's chain: XXH3 over ``le_u64(parent) ‖ le_u64(local)``."""
    return _xxh3(_pack_pair(parent, local), seed)


def sequence_hashes(local_hashes: Sequence[int], seed: int = XXH3_SEED) -> list[int]:
    """Dynamo's ``compute_seq_hash_for_block``: the first equals its local hash, then chained."""
    if not local_hashes:
        return []
    out = [local_hashes[0]]
    parent = local_hashes[0]
    for local in local_hashes[1:]:
        parent = _xxh3(_pack_pair(parent, local), seed)
        out.append(parent)
    return out


@dataclass(frozen=True, slots=True)
class PromptHashes:
    """A prompt's hashes at ``block_size``, made once by whoever made the prompt: ``local`` =
    ``block_hashes(tokens, block_size)``, ``seq`` = ``sequence_hashes(local)`` (a trace replay
    caches them per shared block instead of hashing each prompt whole)."""

    block_size: int
    local: list[int]
    seq: list[int]

    def __post_init__(self) -> None:
        if self.block_size <= 0 or len(self.local) != len(self.seq):
            raise ValueError(
                f"PromptHashes: block_size must be > 0 and local and seq equally long, got "
                f"{self.block_size}, {len(self.local)}, {len(self.seq)}"
            )
