"""The live replay's client (``disaggctl replay --live``) in this process, against a small
OpenAI-compatible server on a real port: what it sends, how it reads each stream, how refusals
and broken streams are counted, and what it writes. The service itself is replayed in
tests/integration/test_replay_live.py."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from cluster.nats_server import free_port
from cluster.traces import ReplayWindow, TracePrompts, TraceReader, trace_requests
from disaggctl.cli import main
from disaggctl.replay.live_arm import served_model

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"
WINDOW, SPEEDUP = "0:20", 10.0
LIMIT = 16_000  # the fake model's context: longer prompts get a 413, as the service answers
BROKEN = 3  # the third request taken loses its connection after its first token
METRICS = """# TYPE disagg_regime gauge
disagg_regime 2
# TYPE disagg_router_temperature gauge
disagg_router_temperature 0.8
# TYPE disagg_pool_workers gauge
disagg_pool_workers{role="prefill"} 3
disagg_pool_workers{role="decode"} 3
"""


class FakeService:
    """``/v1/models``, a streamed ``/v1/completions`` (text in three chunks, then usage and the
    routing), and ``/metrics``; every body it was sent is kept."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.taken = 0
        self.app = FastAPI()
        self.app.get("/v1/models")(self.models)
        self.app.post("/v1/completions")(self.completions)
        self.app.get("/metrics")(self.metrics)

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    async def metrics(self) -> PlainTextResponse:
        return PlainTextResponse(METRICS)

    async def completions(self, request: Request) -> Any:
        body = await request.json()
        self.bodies.append(body)
        n = len(body["prompt"])
        if n > LIMIT:
            return JSONResponse({"error": {"message": "over the context"}}, status_code=413)
        self.taken += 1
        broken = self.taken == BROKEN

        async def frames() -> AsyncIterator[bytes]:
            for piece in ("a", "b", "c"):
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': piece}]})}\n\n".encode()
                if broken:
                    raise RuntimeError("the connection is lost")  # uvicorn drops it
                await asyncio.sleep(0.002)
            usage = {"prompt_tokens": n, "completion_tokens": 3,
                     "prompt_tokens_details": {"cached_tokens": n // 2}}  # fmt: skip
            disagg = {"prefill_worker": 1, "decode_worker": 4, "cached_tokens": n // 2}
            last = {"choices": [], "usage": usage, "disagg": disagg}
            yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()

        return StreamingResponse(frames(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeService, str]]:
    service = FakeService()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(service.app, host="127.0.0.1", port=port, log_level="critical")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the fake service did not start")
        threading.Event().wait(0.02)
    try:
        yield service, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_the_window_is_sent_as_the_trace_says_and_every_answer_is_counted(
    fake: tuple[FakeService, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service, url = fake
    out = tmp_path / "live"
    argv = ["replay", str(SLICE), "--live", url, "--metrics", f"{url}/metrics", "--window",
            WINDOW, "--speedup", str(SPEEDUP), "--out", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    live = json.loads(capsys.readouterr().out)["arms"]["live"]

    start, duration = (float(x) for x in WINDOW.split(":"))
    window = ReplayWindow(start_s=start, duration_s=duration, speedup=SPEEDUP)
    reader = TraceReader(SLICE)
    expected = list(trace_requests(reader, window))
    refused = sum(1 for r in expected if r.input_length > LIMIT)
    assert 0 < refused < len(expected) - 1
    # Every request sent once, its body the trace's: the prompt the simulator replays, the
    # trace's output length, streamed with usage, to the model /v1/models lists.
    prompts = TracePrompts(reader.block_tokens, seed=0)
    sent = sorted((tuple(b["prompt"]), b["max_tokens"]) for b in service.bodies)
    assert sent == sorted((tuple(prompts.tokens(r).tolist()), r.output_length) for r in expected)
    assert {b["model"] for b in service.bodies} == {"fake-model"}
    streamed = {"include_usage": True}
    assert all(b["stream"] and b["stream_options"] == streamed for b in service.bodies)
    # 413s are counted, not retried; the stream cut after its first token is a 599 (a client
    # error, no usage), and nothing else is lost.
    assert live["requests"] == len(expected)
    assert live["statuses"] == {"200": len(expected) - refused - 1, "413": refused, "599": 1}
    assert live["completed"] == len(expected) - refused - 1
    assert live["prefix_reuse"] == pytest.approx(0.5, abs=0.01)  # the server's cached half
    assert live["lateness"]["sent"] == len(expected)

    rows = [json.loads(line) for line in (out / "requests-live.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == sorted(r["index"] for r in rows)
    ok = [r for r in rows if r["status"] == 200]
    assert all(r["output_tokens"] == 3 and r["decode_worker"] == 4 for r in ok)
    assert all(r["ttft_s"] is not None and r["ttft_s"] <= r["e2e_s"] for r in ok)
    assert all(r["itl_mean_s"] is not None and r["itl_mean_s"] >= 0 for r in ok)
    (cut,) = [r for r in rows if r["status"] == 599]
    assert cut["error"] and cut["ttft_s"] is None and cut["output_tokens"] == 0
    ticks = json.loads((out / "ticks-live.json").read_text())
    assert ticks and all(t["regime"] == "saturated" and t["tau"] == 0.8 for t in ticks)
    assert ticks[0]["prefill_workers"] == 3
    summary = (out / "summary.md").read_text()
    assert "live" in summary
    assert {p.name for p in out.glob("*.png")} >= {"ttft.png", "arrivals.png"}


def test_a_service_that_lists_no_model_is_named() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(ValueError, match=rf"no model listed at http://127.0.0.1:{port}/v1/models"):
        served_model(f"http://127.0.0.1:{port}")
