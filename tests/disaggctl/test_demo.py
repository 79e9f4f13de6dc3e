"""``disaggctl demo`` (``disaggctl.demo``) on small batches: every scheduler on every workload
shape, the invariants the table is there to show (dfs-bid is the best DFS order and only it is
priced; the simulator's hit rate never beats the batch's sharing; realised welfare beside the
planned), reproducible per seed, and the files ``main`` writes."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from auction import SCHEDULERS
from disaggctl import demo, system_demo
from disaggctl.cli import main as cli_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N, USERS = 48, 6


@pytest.fixture(scope="module")
def rows() -> list[demo.DemoRow]:
    return demo.run_demo(n=N, users=USERS, seed=0)


def without_timing(rows: list[demo.DemoRow] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    dicts = [r if isinstance(r, dict) else asdict(r) for r in rows]
    return [{k: v for k, v in d.items() if k != "decide_ms"} for d in dicts]


def test_every_scheduler_on_every_workload(rows: list[demo.DemoRow]) -> None:
    assert [(r.workload, r.scheduler) for r in rows] == [
        (w, s) for w in demo.DEMO_WORKLOADS for s in SCHEDULERS
    ]
    for r in rows:
        assert r.n == N
        assert 0 < r.shared_fraction < 1
        # A cache hit is a block of a prefix an earlier prompt shares: no more than the tree's.
        assert 0 < r.cache_hit_rate <= r.shared_fraction + 1e-12
        assert -100 <= r.realised_welfare_pct_above_half <= 100 and r.mean_ttft_s > 0
        assert r.decide_ms >= 0


def test_the_table_shows_what_each_order_buys(rows: list[demo.DemoRow]) -> None:
    for workload in demo.DEMO_WORKLOADS:
        by = {r.scheduler: r for r in rows if r.workload == workload}
        # dfs-bid is welfare-optimal among DFS orders, at least a random order's ½Σb, and
        # bid-sort (ignoring the tree) bounds it from above (planned welfare).
        bid, uniform, weight, sort = (
            by[s].welfare_pct_above_half
            for s in ("dfs-bid", "dfs-uniform", "dfs-weight", "bid-sort")
        )
        assert max(uniform, weight) <= bid + 1e-9 <= sort + 2e-9
        assert bid >= -1e-9
        # Only dfs-bid is priced (VCG); the baselines charge nothing.
        assert by["dfs-bid"].revenue > 0
        assert all(by[s].revenue == 0 for s in SCHEDULERS if s != "dfs-bid")


def test_a_seed_fixes_the_demo(rows: list[demo.DemoRow]) -> None:
    again = demo.run_demo(n=N, users=USERS, seed=0)
    other = demo.run_demo(n=N, users=USERS, seed=1)
    assert without_timing(again) == without_timing(rows)
    assert without_timing(other) != without_timing(rows)


def test_a_subset_of_workloads(rows: list[demo.DemoRow]) -> None:
    chains = demo.run_demo(workloads=("chains",), n=N, users=USERS, seed=0)
    assert {r.workload for r in chains} == {"chains"} and len(chains) == len(SCHEDULERS)
    assert without_timing(chains) == without_timing([r for r in rows if r.workload == "chains"])


def test_format_table(rows: list[demo.DemoRow]) -> None:
    lines = demo.format_table(rows).splitlines()
    assert lines[0].split() == [
        "workload",
        "scheduler",
        "shared",
        "planned",
        "realised",
        "hit",
        "ttft_s",
        "revenue",
        "ms",
    ]
    assert set(lines[1]) == {"-"} and len(lines[1]) == len(lines[0])
    body = lines[2:]
    # One blank line between workloads, one line per row.
    assert body.count("") == len(demo.DEMO_WORKLOADS) - 1
    data = [line.split() for line in body if line]
    assert [(d[0], d[1]) for d in data] == [(r.workload, r.scheduler) for r in rows]
    for d, r in zip(data, rows, strict=True):
        assert d[2] == f"{r.shared_fraction:.1%}" and d[5] == f"{r.cache_hit_rate:.1%}"
        assert float(d[3]) == pytest.approx(r.welfare_pct_above_half, abs=0.005)
        assert float(d[4]) == pytest.approx(r.realised_welfare_pct_above_half, abs=0.005)
        assert float(d[7]) == pytest.approx(r.revenue, abs=0.005)


def test_plot_writes_a_png(rows: list[demo.DemoRow], tmp_path: Path) -> None:
    path = tmp_path / "nested" / "auction.png"
    demo.plot(rows, path)
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_main_writes_the_auction_files_after_the_system_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``main`` with the whole-system run stubbed out (``test_system_demo`` runs it for real)."""
    calls: list[tuple[Path, dict[str, Any]]] = []

    def fake_system_run(out: Path, **kwargs: Any) -> None:
        calls.append((out, kwargs))

    monkeypatch.setattr(system_demo, "run", fake_system_run)
    out = tmp_path / "demo"
    assert demo.main(out, 32, 4, 7) == 0
    assert len(calls) == 1 and calls[0][0] == out and calls[0][1].get("seed") == 7
    written = json.loads((out / "auction.json").read_text())
    expected = demo.run_demo(n=32, users=4, seed=7)
    assert without_timing(written) == without_timing(expected)
    assert (out / "auction.png").read_bytes()[:8] == PNG_MAGIC
    printed = capsys.readouterr().out
    for workload in demo.DEMO_WORKLOADS:
        assert workload in printed
    assert str(out / "auction.json") in printed


@pytest.mark.slow
def test_disaggctl_demo_end_to_end(tmp_path: Path) -> None:
    """``disaggctl demo`` as ``make demo`` runs it (the system run at its own size, ~5 s)."""
    out = tmp_path / "results"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert cli_main(["demo", "--sim", "--n", "32", "--users", "4", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "auction.json",
        "auction.png",
        "system.json",
        "timeline.png",
    ]
    for png in ("auction.png", "timeline.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
    system = json.loads((out / "system.json").read_text())
    assert [p["phase"] for p in system["phases"]] == [p.name for p in system_demo.PHASES]
    auction = json.loads((out / "auction.json").read_text())
    assert len(auction) == len(demo.DEMO_WORKLOADS) * len(SCHEDULERS)
    assert {row["n"] for row in auction} == {32}
    assert "priced priority at saturation" in printed.getvalue()
