"""Report pieces (disaggctl/experiment/report.py) and the duration estimate (runner.estimate)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from disaggctl.experiment.base import Plan, Settings, regime_of
from disaggctl.experiment.fanout import Job
from disaggctl.experiment.report import (
    Section,
    markdown_table,
    render,
    write_csv,
    write_docs,
    write_json,
)
from disaggctl.experiment.runner import EXPERIMENTS, estimate, load


def test_csv_has_a_header_and_empty_cells_for_unknown_figures(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "x.csv", [{"a": 1, "b": float("nan")}, {"a": 2, "c": [1, 2]}])
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["a", "b", "c"]
    assert rows[1] == ["1", "", ""]
    assert rows[2] == ["2", "", "1 2"]


def test_json_is_strict(tmp_path: Path) -> None:
    path = write_json(tmp_path / "x.json", {"x": float("nan"), "y": [float("inf"), 1.0]})

    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {"x": None, "y": [None, 1.0]}


def test_markdown_table_escapes_pipes() -> None:
    text = markdown_table(("a", "b"), [("x|y", 0.5)])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 0.500 |"]


def test_figures_link_relative_to_where_the_report_lives(tmp_path: Path) -> None:
    section = Section("poa", "poa: title")
    section.text("Setup.")
    section.figure("f.png", "A caption", "What it shows.")
    assert "![A caption](f.png)" in render(section)
    assert "![A caption](poa/f.png)" in render(section, prefix="poa/")
    (tmp_path / "out" / "poa").mkdir(parents=True)
    (tmp_path / "out" / "poa" / "f.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    page = write_docs([section], tmp_path / "out", tmp_path / "docs", "# Results")
    assert page == tmp_path / "docs" / "results.md"
    assert "![A caption](results/poa/f.png)" in page.read_text()
    assert (tmp_path / "docs" / "results" / "poa" / "f.png").exists()


def test_regime_labels_follow_the_thresholds() -> None:
    assert [regime_of(x, 1.0, 3.0) for x in (0.5, 1.0, 2.9, 3.0, None)] == [
        "below",
        "transition",
        "transition",
        "saturated",
        None,
    ]


def test_estimate_scales_with_units_and_workers() -> None:
    plans = {"poa": Plan({}, [Job("m:f", units=100.0), Job("m:f", units=100.0)])}
    one = estimate(plans, 1)
    assert one == 200.0 * load("poa").SECONDS_PER_UNIT
    assert estimate(plans, 2) == one / 2
    assert estimate(plans, 8) == one / 2  # never more workers than jobs
    assert estimate(plans, 1, speed=2.0) == 2 * one


def test_every_experiment_plans_quick_and_full_with_the_trials() -> None:
    for name in EXPERIMENTS:
        module = load(name)
        quick, full = module.plan(Settings(quick=True)), module.plan(Settings(quick=False))
        assert 0 < len(quick.jobs) <= len(full.jobs), name
        assert quick.setup and full.setup
        seeds = {job.kwargs.get("seed") for job in full.jobs} - {None}
        assert seeds == {0, 1, 2}, name
        assert len(module.plan(Settings(trials=2)).jobs) < len(full.jobs), name
