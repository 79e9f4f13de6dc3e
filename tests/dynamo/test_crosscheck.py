"""Our simulator against Dynamo's offline replay (docs/design.md §8, "The simulator checked against
Dynamo's"; the whole grid is ``bench.crosscheck``).

The ``dynamo-mocker`` profile is Dynamo's mocker with its default timing: a lone request's prefill
and decode steps take what they take in Dynamo's replay (to 1%), and a few hundred requests of
Mooncake's trace on 2P/4D give the same figures and the same effect of the KV router in both. Our
B200 profile exported as Dynamo's external tables is read back by Dynamo as written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import crosscheck
from cluster.backends.dynamo.replay import DynamoArm, dynamo_replay
from cluster.sim.dynamo_profile import GRID, dynamo_profile_arrays
from cluster.sim.profile import load_profile
from cluster.sim.replay import parse_arm, replay_on_sim
from cluster.traces import TracePrompts, TraceRequest

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"


def _one(tmp_path: Path, isl: int, osl: int) -> tuple[Path, TraceRequest]:
    ids = list(range(-(-isl // 512)))
    path = tmp_path / f"one-{isl}.jsonl"
    row = {"timestamp": 0, "input_length": isl, "output_length": osl, "hash_ids": ids}
    path.write_text(json.dumps(row) + "\n")
    return path, TraceRequest(0, 1, 0.0, isl, osl, tuple(ids))


@pytest.mark.parametrize("profile_name", ["dynamo-mocker", "b200-llama70b-fp8-tp4"])
@pytest.mark.parametrize(("isl", "osl"), [(1000, 6), (12_000, 20), (100_000, 40)])
def test_a_lone_request_takes_the_same_time_in_both(
    tmp_path: Path, profile_name: str, isl: int, osl: int
) -> None:
    """TTFT (the prefill passes, chunked at 8192 tokens, then one decode step) and the mean ITL
    (steps as the KV grows) within 1%: Dynamo's own polynomial for the mocker's profile; for our
    B200 profile, Dynamo reading its tables against ours in the tables' form (no jitter, no
    transfer, a later chunk's attention to the earlier ones left out: what the tables lack)."""
    profile = crosscheck.variant(profile_name, "Dynamo's tables' form")
    path, request = _one(tmp_path, isl, osl)
    out = tmp_path / "requests.jsonl"
    dynamo_replay(path, "1P/1D", DynamoArm("round_robin"), load_profile(profile_name),
                  requests_out=out)  # fmt: skip
    theirs = json.loads(out.read_text().splitlines()[0])
    run = replay_on_sim([request], TracePrompts(512), profile, "1P/1D", parse_arm("round-robin"))
    ours = run.records[0]
    assert ours.ttft is not None and ours.mean_itl is not None
    their_itl = (theirs["last_token_ms"] - theirs["first_token_ms"]) / (osl - 1) / 1000.0
    assert ours.ttft == pytest.approx(theirs["ttft_ms"] / 1000.0, rel=0.01)
    assert ours.mean_itl == pytest.approx(their_itl, rel=0.01)


def test_the_exported_tables_are_the_profiles_costs() -> None:
    profile = load_profile("b200-llama70b-fp8-tp4")
    arrays = dynamo_profile_arrays(profile)
    assert arrays["decode_itl"].shape == (GRID, GRID)
    isl = arrays["prefill_isl"]
    assert arrays["prefill_ttft_ms"][-1] == pytest.approx(
        1000 * profile.prefill.iteration_s([(round(isl[-1]), 0)])
    )
    assert np.all(np.diff(arrays["prefill_ttft_ms"]) > 0)  # more tokens, longer


def test_a_few_hundred_requests_agree_and_so_does_the_routers_effect(tmp_path: Path) -> None:
    """The mocker's timing in both, Mooncake's first 300 requests on 2P/4D at 1.3x the
    capacity our simulator measures: each arm's TTFT median and throughput within 15%, P99 within
    25%, prefix reuse within 0.03, and the KV router's gain over round robin alike."""
    trace = str(crosscheck.write_slice(SLICE, 300, tmp_path / "slice.jsonl"))
    speedup = 1.3 * crosscheck.capacity(trace, "dynamo-mocker", "2P/4D") / crosscheck._rate(trace)
    p99 = {}
    for arm in ("kv 0,1", "round robin"):
        ours = crosscheck.ours(trace, "dynamo-mocker", "as is", "2P/4D", arm, speedup)
        theirs = crosscheck.theirs(trace, "dynamo-mocker", "2P/4D", arm, speedup)
        assert ours["completed"] == theirs["completed"] == 300
        for key, tolerance in crosscheck.WITHIN.items():
            assert ours[key] == pytest.approx(theirs[key], rel=tolerance), (arm, key)
        assert abs(ours["prefix_reuse"] - theirs["prefix_reuse"]) <= crosscheck.REUSE_WITHIN
        p99[arm] = (ours["ttft_p99_s"], theirs["ttft_p99_s"])
    ours_effect = p99["kv 0,1"][0] / p99["round robin"][0]
    their_effect = p99["kv 0,1"][1] / p99["round robin"][1]
    assert ours_effect < 0.9 and their_effect < 0.9  # cache affinity pays on this trace
    assert crosscheck.effect_agrees(ours_effect, their_effect)


def test_effects_agree_by_side_and_size() -> None:
    assert crosscheck.effect_agrees(0.7, 0.65) and crosscheck.effect_agrees(1.02, 0.97)
    assert not crosscheck.effect_agrees(0.7, 1.2)  # opposite sides
    assert not crosscheck.effect_agrees(1.2, 2.0)  # the same side, 1.67x apart
    assert not crosscheck.effect_agrees(float("nan"), 1.0)


def test_the_experiment_writes_its_tables_figure_and_verdict(
    ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``disaggctl experiment crosscheck --quick``, on two small topologies at one load and the
    first 100 requests, to stay short (the agreement itself is checked on 300 above)."""
    from disaggctl.cli import main
    from disaggctl.experiment import crosscheck as experiment

    monkeypatch.setattr(crosscheck, "TOPOLOGIES", ("1P/2D", "2P/2D"))
    monkeypatch.setattr(crosscheck, "LOADS", (0.8,))
    monkeypatch.setattr(experiment, "QUICK_REQUESTS", 100)
    out = tmp_path / "out"
    # On the session's Ray, as a user runs it (its workers import the patched bench module
    # afresh, so the jobs are planned here and only run there).
    argv = ["experiment", "crosscheck", "--quick", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    payload = json.loads((out / "crosscheck" / "crosscheck.json").read_text())
    mocker = payload["results"]["mocker"]
    assert len(mocker["rows"]) == 2 * len(crosscheck.ARMS)
    assert {e["effect"] for e in mocker["effects"]} >= {"KV router over round robin"}
    assert payload["results"]["verdict"]["targets"]  # judged
    report = (out / "crosscheck" / "report.md").read_text()
    assert "**mocker**" in report and "**b200**" in report and "tables' form" in report
    assert (out / "crosscheck" / "crosscheck_p99.png").read_bytes()[:4] == b"\x89PNG"
