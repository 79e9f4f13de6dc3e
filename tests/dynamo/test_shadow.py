"""Our router in shadow (``cluster/backends/dynamo/shadow.py``), in-process: instance ids bound to
slots,
KV events translated, Dynamo's choice followed and compared, the route event's breakdown."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cluster.backends.dynamo.shadow import DynamoPolicy, ShadowRouterActor, dynamo_override
from router import Policy, block_hashes, sequence_hashes

BS = 16
PREFILL, DEC_A, DEC_B = 0xA0000000000000F1, 0xB0000000000000D1, 0xB0000000000000D2
TOKENS = list(range(2000, 2160))  # 10 blocks


def _shadow(**kw: Any) -> ShadowRouterActor:
    args: dict[str, Any] = {
        "prefill_workers": [0], "decode_workers": [1, 2], "block_size": BS,
        "components": {"prefill": "prefill", "decode": "backend"}, "nats_url": None,
        "instances": {"prefill": {0: PREFILL}, "decode": {1: DEC_A, 2: DEC_B}},
    }  # fmt: skip
    return ShadowRouterActor(**(args | kw))


def _stored(instance: int, tokens: list[int]) -> dict[str, Any]:
    local = block_hashes(tokens, BS)
    blocks = [
        {"block_hash": s, "tokens_hash": h}
        for s, h in zip(sequence_hashes(local), local, strict=True)
    ]
    return {"worker_id": instance, "data": {"stored": {"parent_hash": None, "blocks": blocks}}}


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 30))


def test_kv_events_are_translated_to_slots_and_unbound_ones_counted() -> None:
    shadow = _shadow()
    assert shadow.kv_subjects == {
        "prefill": "namespace.dynamo.component.prefill.endpoint.generate.kv-events",
        "decode": "namespace.dynamo.component.backend.endpoint.generate.kv-events",
    }
    assert shadow.feed_kv("prefill", _stored(PREFILL, TOKENS))
    assert not shadow.feed_kv("prefill", _stored(12345, TOKENS))  # no slot holds it
    assert not shadow.feed_kv("decode", _stored(PREFILL, TOKENS))  # the other pool's
    assert shadow.unbound["kv"] == 2
    assert not shadow.feed_kv("prefill", "not a payload")  # the index counts it

    async def body() -> None:
        assert await shadow.overlaps("prefill", TOKENS) == {PREFILL: 10}
        with pytest.raises(ValueError, match="tokens"):
            await shadow.overlaps("prefill", [])

    _run(body)


def test_a_restarted_instance_rebinds_and_its_cache_is_forgotten() -> None:
    shadow = _shadow()
    shadow.feed_kv("prefill", _stored(PREFILL, TOKENS))
    new = PREFILL + 1

    async def body() -> None:
        await shadow.bind_instance("prefill", 0, PREFILL)  # the same id again: nothing changes
        assert await shadow.overlaps("prefill", TOKENS) == {PREFILL: 10}
        await shadow.bind_instance("prefill", 0, new)
        assert await shadow.overlaps("prefill", TOKENS) == {}
        assert not shadow.feed_kv("prefill", _stored(PREFILL, TOKENS))  # the dead one's
        assert shadow.feed_kv("prefill", _stored(new, TOKENS[:32]))
        assert await shadow.overlaps("prefill", TOKENS) == {new: 2}
        with pytest.raises(ValueError, match="instance_id"):
            await shadow.bind_instance("prefill", 0, -1)
        with pytest.raises(ValueError, match="role"):
            await shadow.bind_instance("middle", 0, 5)
        stats = await shadow.stats()
        assert stats.binding.instances["prefill/0"] == new

    _run(body)


def test_policy_is_handed_to_dynamo_in_its_field_names() -> None:
    shadow = _shadow(tau=0.0, omega=1.0)

    async def body() -> None:
        await shadow.set_policy(Policy(0.8, 0.1, 3, "saturated"))
        policy = await shadow.policy()
        assert policy == DynamoPolicy(
            {"router_temperature": 0.8, "overlap_score_weight": 0.1}, 3, "saturated"
        )

    _run(body)
    assert dynamo_override(0, 1) == {"router_temperature": 0.0, "overlap_score_weight": 1.0}


def test_pool_changes_keep_bindings_right() -> None:
    shadow = _shadow()

    async def body() -> None:
        await shadow.remove_worker("decode", 2)
        assert ("decode", 2) not in shadow.instance_of and DEC_B not in shadow.slot_of
        new = 0xC0000000000000E2
        await shadow.bind_instance("prefill", 2, new)  # a re-split's worker binds first ...
        await shadow.add_worker("prefill", 2)  # ... then joins at "warm"
        assert shadow.feed_kv("prefill", _stored(new, TOKENS))
        assert await shadow.overlaps("prefill", TOKENS) == {new: 10}

    _run(body)


def test_bad_components_are_refused() -> None:
    with pytest.raises(ValueError, match="components"):
        _shadow(components={"prefill": "prefill"})
