"""Prompts for trace rows: block ids become token blocks, deterministically (docs/design.md §8).

A trace names a prompt's blocks, not its tokens. Block key ``K`` stands for ``block_tokens``
token ids drawn from a seeded stream of its own, counter-based so that any block can be made
alone and in any order:

    token(K, j) = low + mix(mix(K ⊕ s) + j·γ) mod (high − low),   j = 0 … block_tokens − 1,

``mix`` the SplitMix64 finaliser (a bijection of 64-bit words; Steele, Lea & Flood 2014), γ its
golden-ratio increment, ``s`` the seed's word and [low, high) the token space (by default the
word pieces of the project's tokenizer, :func:`cluster.model_dir.word_token_ids`, ids every
served model has). A prompt is its blocks' tokens in order, the last block cut to the prompt's
length, so two requests whose leading ids agree share exactly that prefix in token space, and
every router and KV cache, at its own block size, sees the trace's own sharing.

Rows without prefix information (Azure's) get unique prompts: request ``i``'s block ``k`` has a
key of its own, ``mix(2⁶² + i·2²⁴ + k)``. A sharing model is named explicitly:
``prefix-groups:R:G`` puts request ``i`` in group ``mix(s ⊕ i) mod G`` and gives it that group's
first ⌊R·L / 512⌋ blocks (``mix(2⁶³ + g·2²⁴ + k)``) before its own: the shape of Dynamo's
``trace_shared_prefix_ratio`` and ``trace_num_prefix_groups``. Synthetic keys come from disjoint
inputs of a bijection, so they never collide with each other.

For the simulator, :meth:`TracePrompts.hashes` also gives the router's block hashes
(``router.block_hashes`` and ``router.sequence_hashes`` of the tokens, at the router's block
size): a block's local hashes are cached by key (bounded, least recently used first out) and a
block's sequence hashes by (parent's sequence hash, key), so a prefix shared by many requests is
hashed once.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from cluster.model_dir import word_token_ids
from cluster.traces.window import TraceRequest
from router import PromptHashes, block_hashes, sequence_hashes

__all__ = [
    "SYNTHETIC_BLOCK_TOKENS",
    "PrefixGroups",
    "TracePrompts",
    "parse_sharing",
]

SYNTHETIC_BLOCK_TOKENS: Final = 512  # the blocks of rows without ids: Mooncake's size
_GAMMA: Final = np.uint64(0x9E3779B97F4A7C15)
_M1: Final = np.uint64(0xBF58476D1CE4E5B9)
_M2: Final = np.uint64(0x94D049BB133111EB)
_UNIQUE: Final = 1 << 62
_GROUP: Final = 1 << 63
_MAX_BLOCKS_PER_PROMPT: Final = 1 << 24  # k < 2^24 in the synthetic keys' inputs


def _mix(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finaliser, elementwise (uint64 arithmetic wraps, as it must)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _mix1(value: int) -> int:
    return int(_mix(np.array([value], dtype=np.uint64))[0])


@dataclass(frozen=True)
class PrefixGroups:
    """``prefix-groups:R:G``: each request shares the first ⌊R·L / 512⌋ blocks of one of G
    groups' prompts (module docstring)."""

    ratio: float
    groups: int

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"prefix-groups ratio must lie in [0, 1], got {self.ratio}")
        if not 1 <= self.groups <= 1_000_000:
            raise ValueError(f"prefix-groups groups must lie in [1, 10^6], got {self.groups}")

    @property
    def name(self) -> str:
        return f"prefix-groups:{self.ratio:g}:{self.groups}"


_SHARING = re.compile(r"prefix-groups:([0-9]*\.?[0-9]+):([0-9]+)")


def parse_sharing(text: str | None) -> PrefixGroups | None:
    """A sharing model by name: ``none`` (or None) or ``prefix-groups:R:G``."""
    if text is None or text == "none":
        return None
    found = _SHARING.fullmatch(text)
    if found is None:
        raise ValueError(f"unknown sharing model {text!r}; known: none, prefix-groups:R:G")
    return PrefixGroups(float(found.group(1)), int(found.group(2)))


class TracePrompts:
    """Token ids and router hashes for a replay's requests (module docstring).

    ``block_tokens``: the tokens one trace id stands for (None: the trace has no ids, every
    prompt is synthetic). ``cache_blocks``: how many blocks' hashes are kept."""

    def __init__(
        self,
        block_tokens: int | None,
        *,
        seed: int = 0,
        sharing: PrefixGroups | None = None,
        token_space: range | None = None,
        cache_blocks: int = 1 << 14,
    ) -> None:
        if block_tokens is not None and block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        if not 0 <= seed < 1 << 32:
            raise ValueError(f"seed must lie in [0, 2^32), got {seed}")
        space = token_space if token_space is not None else word_token_ids()
        if len(space) < 2 or space.step != 1 or space.start < 0 or space.stop > 1 << 32:
            raise ValueError(f"token_space must be a range of >= 2 uint32 ids, got {space}")
        self.block_tokens = block_tokens
        self.seed = seed
        self.sharing = sharing
        self.token_space = space
        self._low, self._span = np.uint64(space.start), np.uint64(len(space))
        self._seed_word = np.uint64(_mix1(seed + 0x5EED))
        self._positions = np.arange(max(block_tokens or 0, SYNTHETIC_BLOCK_TOKENS), dtype=np.uint64)
        self._cache_blocks = cache_blocks
        self._local: OrderedDict[tuple[int, int], list[int]] = OrderedDict()
        self._seq: OrderedDict[tuple[int, int, int], list[int]] = OrderedDict()

    # -- blocks ------------------------------------------------------------------------------

    def blocks(self, request: TraceRequest) -> tuple[list[int], int]:
        """The prompt's block keys and the tokens each stands for (the last one is cut)."""
        if request.block_ids is not None:
            if self.block_tokens is None:
                raise ValueError("this trace's rows carry block ids: block_tokens is needed")
            return list(request.block_ids), self.block_tokens
        size = SYNTHETIC_BLOCK_TOKENS
        n = -(-request.input_length // size)
        if n >= _MAX_BLOCKS_PER_PROMPT:
            raise ValueError(
                f"request {request.index}: {n} blocks, at most {_MAX_BLOCKS_PER_PROMPT - 1}"
            )
        shared = 0
        keys: list[int] = []
        if self.sharing is not None:
            group = _mix1(int(self._seed_word) ^ request.index) % self.sharing.groups
            shared = min(n, int(self.sharing.ratio * request.input_length) // size)
            base = _GROUP + group * _MAX_BLOCKS_PER_PROMPT
            keys = [int(k) for k in _mix(np.arange(base, base + shared, dtype=np.uint64))]
        base = _UNIQUE + request.index * _MAX_BLOCKS_PER_PROMPT
        keys += [int(k) for k in _mix(np.arange(base + shared, base + n, dtype=np.uint64))]
        return keys, size

    def block_token_ids(self, keys: list[int], size: int) -> npt.NDArray[np.uint32]:
        """Each key's ``size`` tokens, one row per key (the formula in the module docstring)."""
        starts = _mix(np.asarray(keys, dtype=np.uint64) ^ self._seed_word)
        z = _mix(starts[:, None] + self._positions[None, :size] * _GAMMA)
        return (self._low + z % self._span).astype(np.uint32)

    def tokens(self, request: TraceRequest) -> npt.NDArray[np.uint32]:
        """The prompt's token ids (``input_length`` of them)."""
        keys, size = self.blocks(request)
        return self.block_token_ids(keys, size).reshape(-1)[: request.input_length]

    # -- router hashes -----------------------------------------------------------------------

    def prompt(
        self, request: TraceRequest, block_size: int
    ) -> tuple[npt.NDArray[np.uint32], PromptHashes]:
        """The prompt's tokens and its router hashes at ``block_size`` (module docstring)."""
        keys, size = self.blocks(request)
        grid = self.block_token_ids(keys, size)
        tokens = grid.reshape(-1)[: request.input_length]
        if size % block_size:  # router blocks straddle the trace's: hash the prompt whole
            whole = block_hashes(tokens, block_size)
            return tokens, PromptHashes(block_size, whole, sequence_hashes(whole))
        per_block = size // block_size
        local: list[int] = []
        seq: list[int] = []
        parent = 0  # sequence hashes: 0 stands for "no parent" in the cache's key only
        full, rest = divmod(request.input_length, size)
        for k, key in enumerate(keys):
            count = per_block if k < full else rest // block_size
            if count == 0:
                break
            block_local = self._cached_local(key, block_size, grid[k])
            block_seq = self._cached_seq(parent, key, block_size, block_local, bool(seq))
            local += block_local[:count]
            seq += block_seq[:count]
            parent = block_seq[-1]
        return tokens, PromptHashes(block_size, local, seq)

    def _cached_local(self, key: int, block_size: int, tokens: npt.NDArray[np.uint32]) -> list[int]:
        cache = self._local
        found = cache.get((key, block_size))
        if found is None:
            found = cache[(key, block_size)] = block_hashes(tokens, block_size)
            if len(cache) > self._cache_blocks:
                cache.popitem(last=False)
        else:
            cache.move_to_end((key, block_size))
        return found

    def _cached_seq(
        self, parent: int, key: int, block_size: int, local: list[int], has_parent: bool
    ) -> list[int]:
        cache = self._seq
        slot = (parent if has_parent else -1, key, block_size)
        found = cache.get(slot)
        if found is None:
            if has_parent:
                # Chain on from the parent: seq[0] of a block continues the prompt's chain.
                chained = sequence_hashes([parent, *local])[1:]
            else:
                chained = sequence_hashes(local)
            found = cache[slot] = chained
            if len(cache) > self._cache_blocks:
                cache.popitem(last=False)
        else:
            cache.move_to_end(slot)
        return found
