"""The demo's load client: its schedule and its prompts (the HTTP part runs in the demo's
integration test against the live service)."""

from __future__ import annotations

import pytest

from disaggctl.load_client import (
    ClientResult,
    LoadPhase,
    PromptSource,
    by_phase,
    concurrency_at,
    output_lengths,
)

PHASES = (LoadPhase("calm", 10.0, 8, ramp_s=2.0), LoadPhase("ramp", 20.0, 48, ramp_s=20.0))


def test_concurrency_ramps_linearly_from_the_previous_level_then_holds() -> None:
    assert concurrency_at(PHASES, 0.0) == ("calm", 0)
    assert concurrency_at(PHASES, 1.0) == ("calm", 4)
    assert concurrency_at(PHASES, 5.0) == ("calm", 8)
    assert concurrency_at(PHASES, 10.0) == ("ramp", 8)
    assert concurrency_at(PHASES, 20.0) == ("ramp", 28)
    assert concurrency_at(PHASES, 29.99) == ("ramp", 48)
    assert concurrency_at(PHASES, 30.0) == ("", 0)  # the schedule is over


@pytest.mark.parametrize(
    "kwargs", [{"seconds": 0.0}, {"ramp_s": 11.0}, {"concurrency": -1}, {"concurrency": 5000}]
)
def test_bad_phases_are_refused(kwargs: dict[str, float]) -> None:
    base = {"name": "p", "seconds": 10.0, "concurrency": 4, "ramp_s": 1.0}
    with pytest.raises(ValueError, match="phase 'p'"):
        LoadPhase(**{**base, **kwargs})  # type: ignore[arg-type]


def test_prompts_share_one_of_five_system_templates_and_are_reproducible() -> None:
    a, b = PromptSource(seed=3), PromptSource(seed=3)
    chats = [a.messages() for _ in range(50)]
    assert chats == [b.messages() for _ in range(50)]
    systems = {chat[0]["content"] for chat in chats}
    assert 1 < len(systems) <= 5  # shared prefixes: what the KV-aware router can exploit
    assert all(chat[0]["role"] == "system" and chat[1]["role"] == "user" for chat in chats)
    assert len({chat[1]["content"] for chat in chats}) == 50  # questions are unique
    assert all(80 <= len(chat[0]["content"].split()) <= 110 for chat in chats)


def test_results_are_attributed_to_the_phase_they_were_sent_in() -> None:
    def result(phase: str) -> ClientResult:
        return ClientResult("u", phase, 0.0, 200, 0.1, 0.01, 0.5, 8, 0.0, 0)

    grouped = by_phase([result("calm"), result("ramp"), result("calm")])
    assert {k: len(v) for k, v in grouped.items()} == {"calm": 2, "ramp": 1}


def test_output_lengths_spread_uniformly_around_max_tokens() -> None:
    fixed = output_lengths(64, 0.0, seed=1)
    assert {fixed() for _ in range(100)} == {64}
    spread = output_lengths(64, 0.5, seed=1)
    lengths = [spread() for _ in range(2000)]
    assert min(lengths) == 32 and max(lengths) == 96  # the whole range, nothing outside
    assert abs(sum(lengths) / len(lengths) - 64) < 2
    again = output_lengths(64, 0.5, seed=1)
    assert [again() for _ in range(2000)] == lengths


@pytest.mark.parametrize(("tokens", "ratio"), [(64, 1.0), (64, -0.1), (0, 0.5)])
def test_bad_output_lengths_are_refused(tokens: int, ratio: float) -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        output_lengths(tokens, ratio, seed=0)
