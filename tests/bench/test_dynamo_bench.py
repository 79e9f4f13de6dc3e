"""``bench/dynamo.py --reduced``, run for real as a subprocess: Dynamo's frontend and our ingress
over Dynamo mocker pools, the same load on both. The JSON must be strict and complete, every
figure finite and positive, and no process of the run may be left behind. Whether the target is
met is the benchmark's verdict, printed in the JSON, not this test's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600
MARK = "DISAGG_BENCH_RUN"  # in the environment of the run and of every process it starts
RUN_ID = uuid.uuid4().hex


def processes_of_this_run() -> list[tuple[int, str]]:
    """Live processes whose environment carries this run's mark (Linux /proc): the bench,
    its NATS, Dynamo, watchdog and Ray processes all inherit it."""
    needle = f"{MARK}={RUN_ID}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append((int(entry.name), cmdline[:200]))
    return found


def _positive(value: Any, where: str) -> None:
    assert isinstance(value, int | float) and not isinstance(value, bool), (where, value)
    assert math.isfinite(value) and value > 0, (where, value)


@pytest.fixture(scope="module")
def run() -> tuple[dict[str, Any], int, str]:
    from cluster.backends.dynamo.install import require_dynamo

    require_dynamo()  # names `make dynamo` when missing: required, never skipped
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           MARK: RUN_ID}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dynamo.py"), "--reduced", "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.stdout.strip(), f"no JSON; stderr:\n{done.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(done.stdout, parse_constant=pytest.fail)
    return report, done.returncode, done.stderr


def test_the_exit_status_follows_the_verdict(run: tuple[dict[str, Any], int, str]) -> None:
    report, status, stderr = run
    assert status == (0 if report["met"] else 1), stderr[-4000:]
    assert report["benchmark"] == "dynamo" and report["reduced"] is True
    (key,) = report["targets"]
    assert key == "throughput_ingress_over_frontend_at_8"
    assert isinstance(report["targets"][key]["met"], bool)
    assert report["notes"] and all(isinstance(n, str) for n in report["notes"])


def test_every_level_has_finite_positive_figures(run: tuple[dict[str, Any], int, str]) -> None:
    report, _, _ = run
    assert report["config"]["mocker"] and report["config"]["controller"]["theta1_s"] > 0
    assert [p["clients"] for p in report["points"]] == report["config"]["levels"] == [8]
    for point in report["points"]:
        for system in ("frontend", "ingress", "ingress_proxy"):
            row = point[system]
            assert row["errors"] == {} and row["no_content"] == 0, (system, row)
            for key in ("requests", "rps", "ttft_p50_ms", "ttft_p99_ms", "chunks_mean"):
                _positive(row[key], f"{system}.{key}")
        for key in ("rps", "ttft_p50", "ttft_p99"):
            _positive(point["ingress_over_frontend"][key], f"ratio {key}")
            _positive(point["ingress_proxy_over_frontend"][key], f"proxy ratio {key}")
    for key, value in report["startup_s"].items():
        _positive(value, f"startup {key}")


def test_agreement_and_actor_calls_are_reported(run: tuple[dict[str, Any], int, str]) -> None:
    report, _, _ = run
    assert report["policy"]["before"]["tau"] == report["policy"]["after"]["tau"] == 0.0
    for role in ("prefill", "decode"):
        row = report["agreement_tau0"][role]
        _positive(row["total"], f"{role} total")
        assert row["same"] + row["tie"] + row["different"] == row["total"]
        for rate in ("same_rate", "same_or_tie_rate"):
            assert 0.0 <= row[rate] <= 1.0, (role, rate, row)
        # Our cost of Dynamo's pick is never below our own lowest cost.
        assert report["cost_gap_tau0"][role] >= 0.0, report["cost_gap_tau0"]
    assert report["cost_gap_tau0"]["prefill"] == 0.0  # one prefill worker: always our pick
    # Below saturation every request is admitted under the lease and followed in-process.
    assert report["actor_calls"]["per_request"] == 0.0, report["actor_calls"]
    # Dynamo's frontend used every mocker: the prefill worker and both decode workers.
    served = report["served"]["frontend_per_worker"]
    assert set(served) == {"prefill-0", "decode-1", "decode-2"}, served
    for name, value in served.items():
        _positive(value, f"served {name}")
    # ... and our replicas' routing reached the router actor through their load reports.
    _positive(sum(report["served"]["ingress_routed_to"]["decode"].values()), "ingress routed")


def test_no_process_of_the_run_is_left(run: tuple[dict[str, Any], int, str]) -> None:
    deadline = time.monotonic() + 15.0  # a bound on hanging: the bench stops all synchronously
    while (left := processes_of_this_run()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"
