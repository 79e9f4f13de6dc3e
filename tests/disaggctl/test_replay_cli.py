"""``disaggctl replay`` on the simulator: the report's files and figures, and every bad flag or
bad line refused with its name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disaggctl.cli import main
from tests.disaggctl.test_cli import strict_json, usage_error

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"
AZURE = ROOT / "data" / "traces" / "azure_code_2023_10min.csv"


def test_arms_side_by_side_with_their_ratios_files_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "replay", str(MOONCAKE), "--max-requests", "60", "--topology", "2P/2D", "--no-ray",
        "--policy", "static:0,1", "--policy", "round-robin", "--policy", "adaptive",
        "--resplit", "on", "--out", str(tmp_path), "--quiet",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = strict_json(capsys.readouterr().out)
    assert set(printed["arms"]) == {"static:0,1", "round-robin", "adaptive+resplit"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    first = summary["arms"][0]
    assert first["name"] == "static:0,1" and first["ratios_to_first"]["ttft_p99_s"] == 1.0
    for arm in summary["arms"]:
        assert arm["summary"]["requests"] == arm["summary"]["completed"] == 60
        assert arm["summary"]["trace"]["bad_lines"] == 0
        for name in arm["files"]:
            assert (tmp_path / name).stat().st_size > 0
    lines = (tmp_path / "requests-round-robin.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    assert [r["index"] for r in rows] == list(range(60)) and rows[0]["line"] == 1
    assert all(r["status"] == "ok" and r["ttft_s"] > 0 for r in rows)
    ticks = json.loads((tmp_path / "ticks-adaptive-resplit.json").read_text())
    assert {"t", "regime", "tau", "omega", "prefill_workers", "poa_hat"} <= ticks[0].keys()
    setup = summary["setup"]
    assert (setup["topology"], setup["seed"], setup["speedup"]) == ("2P/2D", 0, 1.0)
    assert setup["theta1_s"] < setup["theta2_s"]
    text = (tmp_path / "summary.md").read_text()
    assert "| round-robin |" in text and "ttft p99 / first" in text
    for png in ("ttft.png", "arrivals.png", "prefix_reuse.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_azure_trace_with_a_sharing_model_and_a_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "replay", str(AZURE), "--window", "0:60", "--speedup", "2", "--policy", "static:0,1",
        "--sharing", "prefix-groups:0.5:4", "--topology", "1P/2D", "--out", str(tmp_path),
        "--quiet",
    ]  # fmt: skip
    assert main(argv) == 0
    arm = strict_json(capsys.readouterr().out)["arms"]["static:0,1"]
    assert 30 < arm["requests"] == arm["completed"] < 400
    assert arm["prefix_reuse"] > 0.2  # the groups' shared halves hit the cache
    assert arm["virtual_s"] < 40.0  # 60 trace seconds at ×2, and the last answers
    # Azure's code trace is bursty: its seconds 60-90 hold no request at all.
    err_argv = ["replay", str(AZURE), "--window", "60:30", "--out", str(tmp_path), "--quiet"]
    assert main(err_argv) == 1
    assert "no request of the trace falls in the replayed window" in capsys.readouterr().err


def test_a_bad_line_stops_the_replay_with_its_place_unless_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = MOONCAKE.read_text().splitlines()[:20]
    lines[7] = lines[7].replace('"input_length": ', '"input_length": -')
    trace = tmp_path / "bad.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert main(["replay", str(trace), "--policy", "static:0,1", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"disaggctl: {trace}:8: input_length: " in err and "Traceback" not in err
    argv = ["replay", str(trace), "--policy", "static:0,1", "--out", str(out), "--quiet",
            "--skip-bad-lines"]  # fmt: skip
    assert main(argv) == 0
    arm = strict_json(capsys.readouterr().out)["arms"]["static:0,1"]
    assert arm["requests"] == 19 and arm["trace"]["bad_lines"] == 1
    assert ":8: input_length:" in arm["trace"]["bad_examples"][0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--window", "10"], "--window must be START:DURATION in seconds, START >= 0 and "
         "DURATION > 0, got '10'"),
        (["--speedup", "0"], "--speedup must be > 0.0, got 0.0"),
        (["--policy", "greedy"], "--policy unknown policy 'greedy'; known: adaptive"),
        (["--policy", "adaptive", "--policy", "adaptive"], "--policy an arm is given twice"),
        (["--sharing", "half"], "--sharing unknown sharing model 'half'"),
        (["--max-requests", "0"], "--max-requests must be >= 1, got 0"),
        (["--topology", "3X"], "--topology must look like xP/yD"),
    ],
)
def test_bad_flags_are_refused_before_any_work(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    err = usage_error(capsys, ["replay", str(MOONCAKE), *flags])
    assert message in err


def test_flags_that_belong_to_another_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, ["replay", str(MOONCAKE), "--metrics", "http://x:1/metrics"])
    assert "go with --live" in err
    err = usage_error(capsys, ["replay", str(MOONCAKE), "--policy", "static:0,1",
                               "--resplit", "on", "--out", str(tmp_path)])  # fmt: skip
    assert "--resplit on needs an adaptive --policy" in err
    err = usage_error(capsys, ["replay", str(tmp_path / "none.jsonl")])
    assert "--trace must be a trace file that exists" in err
