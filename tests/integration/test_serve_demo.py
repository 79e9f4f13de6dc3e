"""``make demo`` in small: the live service driven over HTTP by the load client, the report and
the timeline it writes (docs/design.md "Serve runtime")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disaggctl.load_client import LoadPhase
from disaggctl.serve_demo import BIDDERS, format_report, run_serve_demo

pytestmark = pytest.mark.integration

PHASES = (LoadPhase("calm", 6.0, 4, ramp_s=1.0), LoadPhase("busy", 8.0, 24, ramp_s=2.0))


@pytest.mark.usefixtures("ray_session")
def test_the_demo_drives_the_live_service_and_reports(tmp_path: Path) -> None:
    report = run_serve_demo(tmp_path, phases=PHASES, speedup=1.0, quiet=True)
    assert [row["phase"] for row in report["phases"]] == ["calm", "busy"]
    for row in report["phases"]:
        assert row["requests"] > 0 and row["errors"] == 0, report.get("errors")
        assert row["ttft_p50_s"] is not None and row["ttft_p50_s"] <= row["ttft_p99_s"]
    busy, calm = report["phases"][1], report["phases"][0]
    assert busy["throughput_rps"] > calm["throughput_rps"]  # more clients, more answers
    users = {u["user"]: u for u in report["users"]}
    assert set(users) == {name for name, _, _ in BIDDERS} | {"anonymous"}
    for name, bid, _ in BIDDERS:  # a VCG payment never exceeds the bid
        assert users[name]["paid"] <= bid * users[name]["answered"] + 1e-9
    assert users["anonymous"]["paid"] == 0.0
    assert users["anonymous"]["answered"] > 0
    for row in users.values():  # the table's per-request price and TTFTs, beside the totals
        if not row["answered"]:
            assert row["paid_per_request"] is None and row["ttft_p50_s"] is None
            continue
        assert row["paid_per_request"] == pytest.approx(row["paid"] / row["answered"])
        assert row["ttft_p50_s"] is not None and row["ttft_p50_s"] <= row["ttft_p99_s"]
    assert "per req" in format_report(report) and "TTFT p50" in format_report(report)
    # The ledger's charges are the auction's revenue, and welfare is V_i summed over users.
    assert sum(u["paid"] for u in users.values()) == pytest.approx(report["revenue"])
    assert sum(u["welfare"] for u in users.values()) == pytest.approx(report["welfare"])
    assert report["regimes"] and report["regimes"][0]["regime"] == "below"
    assert len(report["timeline"]) >= 10  # one reading of /metrics per second
    saved = json.loads((tmp_path / "serve.json").read_text())
    assert saved["phases"] == report["phases"]
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = format_report(report)
    assert "calm" in text and "busy" in text and "revenue charged" in text
