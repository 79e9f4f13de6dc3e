"""Direct ingress (``ServeConfig.direct_port``, cluster/serve/direct_ingress.py): the live
service's ingress replica answers on its own port with the same API, keys and prices as through
Serve's proxy, with the official ``openai`` client."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.integration.live_service import HTTP_TIMEOUT_S, MODEL, LiveService, auth, key

pytestmark = pytest.mark.integration


def _direct(live: LiveService) -> str:
    urls = live.service.direct_urls
    assert len(urls) == 1 and urls[0] != live.url, urls  # one replica, its own port
    return urls[0]


def test_a_replica_streams_on_its_own_port_with_the_openai_client(
    live_service: LiveService,
) -> None:
    client = openai.OpenAI(
        base_url=_direct(live_service) + "/v1", api_key=key("load"), max_retries=0,
        timeout=HTTP_TIMEOUT_S,
    )  # fmt: skip
    assert [m.id for m in client.models.list()] == [MODEL]
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "direct"}], max_tokens=6, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.strip()
    response = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "direct"}], max_tokens=3
    )
    assert response.headers.get("x-disagg-position") is not None
    assert response.parse().usage is not None and response.parse().usage.completion_tokens == 3


def test_the_replicas_port_asks_for_a_key_and_refuses_bad_bids_as_the_proxy_does(
    live_service: LiveService,
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    for base in (live_service.url, _direct(live_service)):
        with httpx.Client(base_url=base, timeout=HTTP_TIMEOUT_S) as http:
            assert http.post("/v1/chat/completions", json=body).status_code == 401
            bad = http.post(
                "/v1/chat/completions", json={**body, "bid": -1.0}, headers=auth("carol")
            )
            assert bad.status_code == 400 and "bid" in bad.text, (base, bad.text)
