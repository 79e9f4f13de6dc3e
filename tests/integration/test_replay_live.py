"""A production trace against the live service (docs/design.md §8 "Real traces"): the project's
own replay (``disaggctl replay --live``) of a 2-minute slice of Mooncake's trace, and NVIDIA's
aiperf replaying the same trace with the README's command line.

The service is the embedded default's model (Llama-3.1-70B, its 131,072-token context) on 3P/3D
at engine speed-up 4, so that the slice at arrivals ×4 (30 s) is the load the trace's own rate
is on real 3P/3D GPUs: a 2-core machine carries it. Its processes run at a lower priority than
the test's, as a load generator on its own machine would run beside the service.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.common import lower_service_priority
from cluster.config import ServeConfig
from cluster.hub_cache import hub_cache_entry
from cluster.nats_server import free_port
from cluster.service import Service
from cluster.traces import ReplayWindow, TraceReader, trace_requests

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_10min.jsonl"
AIPERF = Path(os.environ.get("DISAGG_AIPERF", ROOT / ".venv-aiperf" / "bin" / "aiperf"))
WINDOW, SPEEDUP = "0:120", 4.0


@pytest.fixture(scope="module")
def trace_service(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("trace-service")
    config = ServeConfig(
        topology="3P/3D",
        speedup=SPEEDUP,
        namespace="tracetest",
        ledger_path=str(tmp / "ledger.sqlite"),
        metrics_port=0,
    )
    service = Service(config)
    try:
        service.start(host="127.0.0.1", port=free_port())
        lower_service_priority()
        yield service
    finally:
        service.stop()


def test_the_projects_replay_sends_the_slice_on_time_and_every_request_is_answered(
    trace_service: Service, tmp_path: Path
) -> None:
    out = tmp_path / "replay"
    run = subprocess.run(
        [sys.executable, "-m", "disaggctl.cli", "replay", str(SLICE), "--live",
         str(trace_service.url), "--metrics", str(trace_service.metrics_url),
         "--window", WINDOW, "--speedup", str(SPEEDUP), "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    live = report["arms"]["live"]
    start, duration = (float(x) for x in WINDOW.split(":"))
    window = ReplayWindow(start_s=start, duration_s=duration, speedup=SPEEDUP)
    expected = sum(1 for _ in trace_requests(TraceReader(SLICE), window))
    assert live["requests"] == expected and expected > 300
    assert live["statuses"] == {"200": expected}  # the 131,072-token context takes every prompt
    assert live["ttft_p50_s"] is not None and live["ttft_p50_s"] <= live["ttft_p99_s"]
    assert 0.0 < live["prefix_reuse"] < 1.0  # the trace's shared blocks hit the KV caches
    lateness = live["lateness"]
    assert lateness["sent"] == expected and lateness["lateness_p50_ms"] >= 0.0
    lines = (out / "requests-live.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == expected and all(r["status"] == 200 for r in rows)
    assert rows[0]["scheduled_s"] == 0.0 and rows[-1]["scheduled_s"] <= duration / SPEEDUP
    ticks = json.loads((out / "ticks-live.json").read_text())
    assert len(ticks) >= 25 and all("regime" in t for t in ticks)  # /metrics each second
    for name in ("summary.md", "summary.json", "ttft.png", "arrivals.png", "prefix_reuse.png"):
        assert (out / name).stat().st_size > 0
    assert "| live |" in (out / "summary.md").read_text()


def test_aiperf_replays_the_trace_with_the_readmes_command(
    trace_service: Service, tmp_path: Path
) -> None:
    assert AIPERF.exists(), f"aiperf is not installed at {AIPERF}: run `make aiperf`"
    trace = tmp_path / "first-minute.jsonl"
    trace.write_text("".join(SLICE.read_text().splitlines(keepends=True)[:40]))
    hf_home = tmp_path / "hf"
    repo = hub_cache_entry(Path(str(trace_service.model_dir)), hf_home)
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [str(AIPERF), "profile", "--model", "disagg-tiny", "--url", str(trace_service.url),
         "--endpoint-type", "completions", "--streaming",
         "--custom-dataset-type", "mooncake_trace", "--input-file", str(trace), "--fixed-schedule",
         "--tokenizer", repo, "--artifact-dir", str(tmp_path / "aiperf"), "--ui-type", "none"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    export = json.loads((tmp_path / "aiperf" / "profile_export_aiperf.json").read_text())
    assert export["request_count"]["avg"] == 40 and export["is_complete"]
    assert export["error_summary"] == []
    assert httpx.get(f"{trace_service.url}/health", timeout=10).status_code == 200
