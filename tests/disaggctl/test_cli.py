from __future__ import annotations

import json

import pytest

from disaggctl.cli import main


def test_auction_command_prints_an_order_and_prices(capsys) -> None:
    assert main(["auction", "--workload", "chains", "--n", "32", "--users", "4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 32 and report["scheduler"] == "dfs-bid"
    assert len(report["first"]) == 5 and report["welfare_pct_above_half"] > 0
    # The five largest payments are part of the revenue, which also counts everyone else's.
    assert report["revenue"] >= sum(report["top_payments"].values()) - 1e-9 > 0


def test_sim_run_command_reports_a_closed_loop_point(capsys) -> None:
    assert main(["sim", "run", "--concurrency", "8", "--seconds", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completed"] > 0 and report["itl_p99_s"] > 0


def test_bad_arguments_end_with_a_clear_message() -> None:
    with pytest.raises(SystemExit, match="unknown workload 'nope'"):
        main(["auction", "--workload", "nope"])
    with pytest.raises(SystemExit, match="bad topology"):
        main(["sim", "run", "--topology", "five"])
