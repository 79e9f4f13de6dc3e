"""``disaggctl experiment all --quick --trials 1``: the whole reduced run, on the test session's
Ray as a user's run is on theirs (every simulation a Ray task).

One trial per point: this checks the pipeline end to end (every experiment's JSON, CSVs, PNGs,
report), not the numbers, and a trial is the unit of work, so one trial costs a third of the
default three. The simulations run in Ray's workers, outside the suite's coverage tracing (which
slows the simulator about 3.4 times); the planning, analysis, plots and reports run here, traced.
That a job gives the same numbers in a Ray task and in-process is tests/experiment/
test_ray_same.py; the mean ± s.e. over several trials is tests/experiment/test_stats.py. Wall
time is not asserted here: timing belongs in bench/.
"""

from __future__ import annotations

import csv
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from disaggctl.cli import main
from disaggctl.experiment.runner import EXPERIMENTS

# The fixture runs every experiment once: about 140 s alone on 2 cores, but a CI run on a busy
# machine took more than the suite's 600 s timeout (2026-12-01). The timeout is there to catch a
# hang, not to time the run (bench/ does that): this module gets a hang's margin of its own.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("experiments")
    started = time.perf_counter()
    status = main(["experiment", "all", "--quick", "--trials", "1", "--out", str(out), "--quiet"])
    return {"out": out, "status": status, "seconds": time.perf_counter() - started}


def _strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_runs_and_writes_every_experiment(run: dict[str, Any]) -> None:
    assert run["status"] == 0
    out: Path = run["out"]
    for name in EXPERIMENTS:
        folder = out / name
        payload = _strict((folder / f"{name}.json").read_text())
        assert payload["experiment"] == name
        assert payload["setup"] and payload["results"]
        assert payload["run"]["quick"] is True and payload["run"]["ray"] is True
        assert payload["run"]["trials"] == 1
        assert (folder / "report.md").read_text().startswith(f"# {name}")
        assert list(folder.glob("*.csv")) and list(folder.glob("*.png")), name


def test_csvs_have_headers_and_rows(run: dict[str, Any]) -> None:
    for path in run["out"].glob("*/*.csv"):
        rows = list(csv.reader(path.open()))
        assert len(rows) >= 2, path
        header = rows[0]
        assert all(h and not re.fullmatch(r"[-+.\deE]+", h) for h in header), (path, header)
        assert all(len(r) == len(header) for r in rows), path


def test_pngs_are_pngs(run: dict[str, Any]) -> None:
    pngs = list(run["out"].glob("*/*.png"))
    assert len(pngs) >= 2 * len(EXPERIMENTS)
    for path in pngs:
        assert path.read_bytes()[:8] == PNG_MAGIC, path


def test_combined_report_has_every_section_and_figure(run: dict[str, Any]) -> None:
    out: Path = run["out"]
    report = (out / "report.md").read_text()
    assert "quick (reduced) run" in report
    for name in EXPERIMENTS:
        assert f"## {name}:" in report, name
    links = re.findall(r"!\[([^\]]+)\]\(([^)]+)\)", report)
    assert len(links) >= 2 * len(EXPERIMENTS)
    for caption, link in links:
        assert (out / link).exists(), link
        # every figure is followed by its computed paragraph
        assert re.search(rf"\*{re.escape(caption)}\.\* \S", report), caption
    assert "nan" not in report.lower().split("nanosecond")[0]
    assert "± 1 s.e." in report
