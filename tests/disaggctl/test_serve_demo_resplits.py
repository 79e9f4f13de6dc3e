"""The live demo's re-split report (``disaggctl.serve_demo.resplit_table``): the controller's
pool steps become one row per re-split, with its start, end, pools before and after, and how it
ended (warm, abandoned, cancelled); the report prints each row, or one line when there was none."""

from __future__ import annotations

from typing import Any

from disaggctl.serve_demo import format_report, resplit_table

START = 1000.0


def step(t: float, action: str, to_role: str, prefill: list[int], decode: list[int]) -> dict:
    return {
        "t": START + t,
        "action": action,
        "worker_id": 3,
        "to_role": to_role,
        "prefill": prefill,
        "decode": decode,
        "reason": f"{action} reason",
    }


def test_a_finished_an_abandoned_and_a_cancelled_resplit_are_one_row_each() -> None:
    steps = [
        step(40.0, "resplit_start", "prefill", [0], [1, 2, 4, 5]),
        step(43.5, "drained", "prefill", [0], [1, 2, 4, 5]),
        step(103.5, "warm", "prefill", [0, 3], [1, 2, 4, 5]),
        step(150.0, "resplit_start", "decode", [0], [1, 2, 4, 5]),
        step(160.0, "abandoned", "decode", [0, 3], [1, 2, 4, 5]),
        step(170.0, "resplit_start", "prefill", [0], [1, 2, 4, 5]),
        step(171.0, "cancelled", "prefill", [0], [1, 2, 3, 4, 5]),
        step(190.0, "resplit_start", "decode", [0], [1, 2, 4, 5]),  # still under way at the end
    ]
    rows = resplit_table({"pools": {"steps": steps}}, START)
    assert [(r["t"], r["end_t"], r["before"], r["after"], r["outcome"]) for r in rows] == [
        (40.0, 103.5, "1P/5D", "2P/4D", "warm"),
        (150.0, 160.0, "2P/4D", "2P/4D", "abandoned"),
        (170.0, 171.0, "1P/5D", "1P/5D", "cancelled"),
        (190.0, None, "2P/4D", None, None),
    ]
    text = format_report(_report(rows))
    assert "re-split at 150s (until 160s): 2P/4D → 2P/4D (abandoned)" in text
    assert "re-split at 170s (until 171s): 1P/5D → 1P/5D (cancelled)" in text
    assert "re-split at 40s (until 104s): 1P/5D → 2P/4D: resplit_start reason" in text
    assert rows[0]["reason"] == "resplit_start reason" and rows[0]["to_role"] == "prefill"


def test_no_snapshot_means_no_rows() -> None:
    assert resplit_table({}, START) == []
    assert resplit_table({"pools": None}, START) == []


def _report(resplits: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "phases": [],
        "regimes": [],
        "resplits": resplits,
        "users": [],
        "welfare": 0.0,
        "revenue": 0.0,
        "errors": {},
        "ledger": "ledger.sqlite",
    }


def test_the_report_prints_each_resplit_or_says_there_was_none() -> None:
    assert "re-splits: none" in format_report(_report([]))
    rows = resplit_table(
        {"pools": {"steps": [step(40.0, "resplit_start", "prefill", [0], [1, 2, 4, 5])]}}, START
    )
    text = format_report(_report(rows))
    assert "re-split at 40s (still warming): 1P/5D → …: resplit_start reason" in text
