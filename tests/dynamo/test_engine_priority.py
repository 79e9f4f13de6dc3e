"""What the mocker does with ``routing.priority`` (docs/design.md §1, "Priority reaches the
engine"): one decode mocker that runs one sequence at a time (``max_num_seqs`` = 1), busy with a
long answer, and three requests waiting behind it, arriving paying, non-paying, paying. The order
in which they start tells the three readings apart: first-come (paying, non-paying, paying), the
larger hint first as vLLM serves dynamo.vllm's (both paying, then the other), or the smaller
hint first (the non-paying one, then both paying). ``DynamoRoutes`` sends ``routing.priority``
negated, as dynamo.vllm expects, so paying requests carry the larger hint.

Dynamo 1.6.1's mocker serves first-come: it carries the hint and ignores it. The simulator's
engines and dynamo.vllm under ``--scheduling-policy priority`` (which ``worker_command`` passes)
do honour it; a Dynamo release whose mocker does too fails this test, and the design's
sentence on the mocker then changes with it."""

from __future__ import annotations

import asyncio
import time

import pytest

from auction.priority import NON_PAYING, PAYING
from cluster.backends.dynamo.discovery import Discovery
from cluster.backends.dynamo.routing import DynamoRoutes
from cluster.backends.dynamo.settings import DynamoSettings
from tests.dynamo.conftest import WorkerFactory

pytestmark = pytest.mark.integration

SETTINGS = DynamoSettings.model_validate(
    {"num_gpu_blocks": 256, "max_restarts": 0, "max_num_seqs": 1, "speedup_ratio": 1.0}
)


def test_the_mocker_serves_its_waiting_requests_first_come_whatever_their_priority(
    dynamo_nats_url: str, discovery_dir: str, dynamo_worker: WorkerFactory
) -> None:
    async def main() -> dict[str, float]:
        pool = [dynamo_worker(SETTINGS, "prefill", 0), dynamo_worker(SETTINGS, "decode", 1)]
        infos = await asyncio.gather(*(w.start() for w in pool))
        prefill_id, decode_id = (info.instance_id for info in infos)
        routes = await DynamoRoutes(
            SETTINGS, nats_url=dynamo_nats_url, discovery=Discovery.folder(discovery_dir),
            model_name=SETTINGS.model_name,
        ).start()  # fmt: skip
        started: dict[str, float] = {}

        async def answer(
            name: str, first: int, max_tokens: int, priority: int, sent: asyncio.Event
        ) -> None:
            tokens = [1, *range(first, first + 63)]
            params = await routes.prefill(tokens, prefill_id, {}, None, priority)
            sent.set()
            async for _ in routes.decode(tokens, decode_id, params, max_tokens, {}, None, priority):
                started.setdefault(name, time.monotonic())

        try:
            long = asyncio.create_task(answer("long", 1000, 600, NON_PAYING, asyncio.Event()))
            while "long" not in started:  # the one slot is taken
                await asyncio.sleep(0.01)
            waiting = []
            for k, (name, priority) in enumerate(
                [("paying-1", PAYING), ("anonymous", NON_PAYING), ("paying-2", PAYING)]
            ):
                # 30 tokens each (about 0.25 s): one starts only once the one before is done.
                sent = asyncio.Event()
                waiting.append(
                    asyncio.create_task(answer(name, 2000 + 100 * k, 30, priority, sent))
                )
                await asyncio.wait_for(sent.wait(), 30)  # prefilled; its decode call is next
                await asyncio.sleep(0.3)  # in the engine's queue before the next arrives
            assert set(started) == {"long"}, started  # all three wait behind the long answer
            await asyncio.wait_for(asyncio.gather(long, *waiting), 120)
            return started
        finally:
            routes.close()
            await asyncio.gather(*(w.shutdown() for w in pool))

    started = asyncio.run(asyncio.wait_for(main(), 240))
    order = sorted(("paying-1", "anonymous", "paying-2"), key=started.__getitem__)
    assert order == ["paying-1", "anonymous", "paying-2"], started
