"""Per-identity admission control (cluster/serve/limits.py): token buckets, concurrency caps,
the share kept for paid users, and the 429 with Retry-After at the HTTP edge, through the
official ``openai`` client."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.config import ServeConfig
from cluster.model_dir import ChatTokenizer, build_model_dir
from cluster.models import ConfigError, validate_model
from cluster.serve.limits import Limiter, LimitSettings, RateLimited
from cluster.serve.users import ANONYMOUS
from tests.cluster.test_ingress_app import (
    MESSAGES,
    MODEL,
    STREAM,
    Clock,
    FakePath,
    client,
    drive,
    make_app,
)


class Tick:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _limiter(clock: Tick, max_ongoing: int = 100, **limits: float) -> Limiter:
    return Limiter(LimitSettings(**limits), max_ongoing=max_ongoing, clock=clock)  # type: ignore[arg-type]


def test_a_token_bucket_allows_its_burst_then_its_rate_and_says_when() -> None:
    clock = Tick()
    limiter = _limiter(clock, user_rate=2.0, user_burst=3)
    for _ in range(3):
        limiter.admit("alice", anonymous=False).release()
    with pytest.raises(RateLimited) as refused:
        limiter.admit("alice", anonymous=False)
    assert refused.value.retry_after_s == 1 and "2 requests/s" in refused.value.reason
    limiter.admit("bob", anonymous=False)  # each user has a bucket of their own
    clock.now = 0.5  # one token back at 2/s
    limiter.admit("alice", anonymous=False).release()
    with pytest.raises(RateLimited):
        limiter.admit("alice", anonymous=False)
    assert limiter.refused == {"rate": 2}


def test_retry_after_is_the_whole_seconds_until_a_token() -> None:
    clock = Tick()
    limiter = _limiter(clock, anonymous_rate=0.25)  # burst 1: one request, then 4 s
    limiter.admit(ANONYMOUS, anonymous=True)
    clock.now = 1.5
    with pytest.raises(RateLimited) as refused:
        limiter.admit(ANONYMOUS, anonymous=True)
    assert refused.value.retry_after_s == math.ceil(4.0 - 1.5)


def test_a_concurrency_cap_counts_requests_until_released_once() -> None:
    limiter = _limiter(Tick(), user_concurrency=2)
    first, second = (limiter.admit("alice", anonymous=False) for _ in range(2))
    with pytest.raises(RateLimited, match="at most 2 requests at once"):
        limiter.admit("alice", anonymous=False)
    first.release()
    first.release()  # twice: counted once
    third = limiter.admit("alice", anonymous=False)
    with pytest.raises(RateLimited):
        limiter.admit("alice", anonymous=False)
    second.release(), third.release()
    assert limiter.refused == {"concurrency": 2}


def test_anonymous_traffic_never_takes_the_paid_users_share() -> None:
    limiter = _limiter(Tick(), max_ongoing=10, paid_reserved_share=0.3)
    held = [limiter.admit(ANONYMOUS, anonymous=True) for _ in range(7)]
    with pytest.raises(RateLimited, match="share"):
        limiter.admit(ANONYMOUS, anonymous=True)
    paid = [limiter.admit("alice", anonymous=False) for _ in range(3)]  # still room for them
    for permit in held + paid:
        permit.release()
    assert limiter.anonymous_in_flight == 0


def test_the_service_figures_are_split_over_the_replicas() -> None:
    limits = LimitSettings(user_rate=10.0, user_burst=20, user_concurrency=5,
                           anonymous_concurrency=1, paid_reserved_share=0.2)  # fmt: skip
    part = limits.per_replica(4)
    assert (part.user_rate, part.user_burst, part.user_concurrency) == (2.5, 5, 2)
    assert part.anonymous_concurrency == 1 and part.anonymous_rate == 0.0  # off stays off
    assert part.paid_reserved_share == 0.2 and limits.per_replica(1) is limits


@given(
    steps=st.lists(st.tuples(st.floats(0.0, 2.0), st.booleans()), max_size=60),
    rate=st.floats(0.5, 20.0), burst=st.integers(1, 10), cap=st.integers(1, 5),
)  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_no_window_admits_more_than_burst_plus_rate_times_its_length(
    steps: list[tuple[float, bool]], rate: float, burst: int, cap: int
) -> None:
    clock = Tick()
    limiter = _limiter(clock, user_rate=rate, user_burst=burst, user_concurrency=cap)
    admitted: list[float] = []
    held = []
    for dt, release in steps:
        clock.now += dt
        if release and held:
            held.pop(0).release()
        try:
            held.append(limiter.admit("alice", anonymous=False))
            admitted.append(clock.now)
        except RateLimited as refused:
            assert refused.retry_after_s >= 1
        assert len(held) <= cap
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            assert j - i + 1 <= burst + rate * (admitted[j] - start) + 1e-9


@pytest.mark.parametrize(
    "bad", [{"user_rate": -1.0}, {"paid_reserved_share": 1.0}, {"user_concurrency": 1.5},
            {"anonymous_rate": float("nan")}, {"limit": 3}],
)  # fmt: skip
def test_bad_limits_are_refused_naming_the_field(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=rf"limits\.{next(iter(bad))}"):
        validate_model(ServeConfig, {"limits": bad}, "serve config")


# -- at the edge -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    return ChatTokenizer.from_dir(
        build_model_dir(tmp_path_factory.mktemp("m") / MODEL, context_tokens=1024))


def test_the_edge_answers_429_with_retry_after_to_the_openai_client(tok: ChatTokenizer) -> None:
    clock = Tick()
    path = FakePath([[5], [6]], Clock())
    app = make_app(tok, path, limiter=_limiter(clock, user_rate=1.0, user_burst=1))

    async def main() -> None:
        api = client(app)
        await api.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError) as refused:
            await api.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        assert refused.value.status_code == 429
        assert refused.value.response.headers["retry-after"] == "1"
        body = refused.value.response.json()["error"]
        assert (body["type"], body["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert "alice" in body["message"]
        assert len(path.requests) == 1  # refused before the path: nothing reserved, nothing run
        clock.now = 1.0
        await api.chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]

    asyncio.run(main())
    assert 'disagg_requests_total{status="429"} 1.0' in app.state.edge.metrics.text()


def test_a_stream_holds_its_place_until_it_ends(tok: ChatTokenizer) -> None:
    path = FakePath([[5], [6], [7]], Clock(), hold_after=1)
    limiter = _limiter(Tick(), user_concurrency=1)
    app = make_app(tok, path, limiter=limiter)

    async def main() -> None:
        gone = asyncio.Event()
        stream = asyncio.ensure_future(drive(app, STREAM, gone=gone))
        await path.waiting.wait()  # the stream is open, its path on hold after a chunk
        with pytest.raises(openai.RateLimitError):
            await client(app).chat.completions.create(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        gone.set()  # the client leaves: its place comes back
        await stream

    asyncio.run(main())
    assert limiter.admit("alice", anonymous=False)  # free again


def test_slow_bodies_hold_no_place_and_are_cut_at_the_body_deadline(tok: ChatTokenizer) -> None:
    """[21] 3: 16 anonymous connections that send a POST's headers and then trickle its body
    (one byte, then nothing) do not lock anonymous traffic out: a place under the limits is
    taken once the body is in, and a body not in within ``limits.body_timeout_s`` is a 408."""
    path = FakePath([[5]] * 4, Clock())
    limiter = _limiter(Tick(), anonymous_concurrency=16)
    app = make_app(tok, path, limiter=limiter, body_timeout_s=0.3)

    async def trickle() -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"{"
            await asyncio.sleep(30.0)  # the rest never comes in time
            yield b"}"

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as http:  # fmt: skip
            return await http.post("/v1/chat/completions", content=body())

    async def main() -> None:
        slow = [asyncio.ensure_future(trickle()) for _ in range(16)]
        await asyncio.sleep(0.05)  # every slow body started
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as http:  # fmt: skip
            answer = await http.post(  # anonymous: no key
                "/v1/chat/completions",
                json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1},
            )
        assert answer.status_code == 200, answer.text
        cut = await asyncio.wait_for(asyncio.gather(*slow), timeout=5.0)
        assert {r.status_code for r in cut} == {408}
        assert {r.json()["error"]["code"] for r in cut} == {"body_timeout"}

    asyncio.run(main())
    assert limiter.admit(ANONYMOUS, anonymous=True)  # every place free again
