"""The frontier's significance rule (``disaggctl/experiment/frontier.py``)."""

from __future__ import annotations

from typing import Any

from disaggctl.experiment.frontier import dominates, mark_frontier


def cell(name: str, rps: float | None, p99: float | None, se: float = 0.0) -> dict[str, Any]:
    return {"name": name, "throughput_rps": rps, "throughput_rps_se": se,
            "ttft_p99_s": p99, "ttft_p99_s_se": se}  # fmt: skip


def test_without_noise_it_is_the_plain_pareto_frontier() -> None:
    cells = [cell("fast", 10.0, 1.0), cell("busy", 12.0, 2.0), cell("worse", 9.0, 1.5)]
    mark_frontier(cells)
    assert [c["frontier"] for c in cells] == [True, True, False]
    assert not dominates(cells[0], cell("twin", 10.0, 1.0))  # a tie beats nothing


def test_a_cell_beaten_only_within_the_noise_stays_on() -> None:
    a, b = cell("a", 10.0, 1.00, se=0.05), cell("b", 10.0, 1.08, se=0.05)
    assert not dominates(a, b)  # 0.08 s better, within 0.05 + 0.05
    c = cell("c", 10.0, 1.20, se=0.05)
    assert dominates(a, c)  # 0.20 s better, beyond the noise
    worse_rate = cell("d", 9.0, 1.20, se=0.05)  # also 1 req/s less: beaten beyond the noise
    faster_rate = cell("e", 11.0, 1.20, se=0.05)  # more throughput beyond the noise: not beaten
    cells = [a, b, c, worse_rate, faster_rate]
    mark_frontier(cells)
    assert [x["name"] for x in cells if x["frontier"]] == ["a", "b", "e"]


def test_an_unmeasured_cell_is_neither_on_nor_a_threat() -> None:
    cells = [cell("none", None, None), cell("a", 1.0, 1.0)]
    mark_frontier(cells)
    assert [x["frontier"] for x in cells] == [False, True]
