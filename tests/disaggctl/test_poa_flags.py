"""The system demo's printed output never shows a Price of Anarchy below 1 silently, and its live
status follows --progress / --quiet (docs/design.md §3). The scenario is stubbed with a synthetic
timeline whose spike reads poa_hat 0.84 (what the estimator printed, unflagged, before), so these
tests take a second and do not depend on the estimator's current numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cluster.sim.control import TickSample
from cluster.sim.scenario import ScenarioResult
from controller.detector import Thresholds
from disaggctl import system_demo

SPIKE = next(i for i, p in enumerate(system_demo.PHASES) if p.name == "spike")


def bounds() -> list[tuple[str, float, float]]:
    out, start = [], 0.0
    for named in system_demo.PHASES:
        out.append((named.name, start, start + named.phase.duration))
        start += named.phase.duration
    return out


def tick(t: float, in_spike: bool) -> TickSample:
    capacity = 0.82 if in_spike else 1.4
    routing = 1.022 if in_spike else 1.05
    return TickSample(
        t=t,
        regime=2 if in_spike else 0,
        tau=0.8 if in_spike else 0.0,
        omega=0.1 if in_spike else 1.0,
        ttft_p99_window_s=None if t < 3 else 0.5,
        ttft_p99_smoothed_s=None if t < 3 else 0.4,
        poa_hat=routing * capacity,  # 0.838 in the spike: impossible, and printed as such
        poa_routing=routing,
        poa_capacity=capacity,
        queue_depth=3,
        in_flight=40,
    )


def fake_result(on_tick: Any) -> ScenarioResult:
    (_, spike_start, spike_end) = bounds()[SPIKE]
    end = bounds()[-1][2]
    timeline = [tick(float(t), spike_start < t <= spike_end) for t in range(1, int(end) + 1)]
    for sample in timeline:
        on_tick(sample)
    phases = []
    for name, start, stop in bounds():
        ticks = [s for s in timeline if start < s.t <= stop]
        mean = {f: sum(getattr(s, f) for s in ticks) / len(ticks) for f in system_demo.POA_FACTORS}
        phases.append(
            {
                "phase": name,
                "start_s": start,
                "end_s": stop,
                "completed": 100,
                "throughput_rps": 20.0,
                "ttft_p99_s": 0.5,
                "itl_p99_s": 0.012,
                **{f: round(v, 4) for f, v in mean.items()},
                "cache_hit_rate": 0.5,
            }
        )
    return ScenarioResult("1P/5D", True, phases, timeline, [], [], [], Thresholds(0.5, 1.5))


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system_demo, "calm_baseline_p99", lambda *a, **k: 0.1)
    monkeypatch.setattr(system_demo, "run_scenario", lambda *a, on_tick, **k: fake_result(on_tick))


def run(out: Path, capsys: pytest.CaptureFixture[str], **kwargs: Any) -> tuple[str, str]:
    system_demo.run(out, seed=0, **kwargs)
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.mark.usefixtures("stubbed")
def test_poa_below_one_is_flagged_counted_and_not_clamped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = run(tmp_path, capsys, quiet=True)
    table = system_demo.format_phases(fake_result(lambda s: None)).splitlines()
    spike_row = next(line for line in table if line.startswith("spike"))
    assert "0.84†" in spike_row and "0.82†" in spike_row and "1.022 " in spike_row
    calm_row = next(line for line in table if line.startswith("calm"))
    assert "†" not in calm_row
    assert spike_row in out
    footnote = out[out.index("† below 1") :]
    ticks = int(sum(p.phase.duration for p in system_demo.PHASES))  # one window per second
    assert "estimator defect" in footnote and f"8 of {ticks} windows read below 1" in footnote
    assert "poa_hat 8, poa_routing 0, poa_capacity 8" in footnote
    # system.json: strict JSON, the count per phase, the values as measured.
    text = (tmp_path / "system.json").read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    spike = data["phases"][SPIKE]
    assert spike["poa_below_one"] == {
        "windows": 8,
        "of_windows": 8,
        "poa_hat": 8,
        "poa_routing": 0,
        "poa_capacity": 8,
    }
    assert data["phases"][0]["poa_below_one"]["windows"] == 0
    assert min(s["poa_hat"] for s in data["timeline"]) == pytest.approx(1.022 * 0.82)
    assert data["priority"][0]["queue_wait_mean_s"] is None  # NaN (nobody waited) is null


def test_flag_helpers() -> None:
    assert system_demo.fmt_poa(0.84, ".2f") == "0.84†"
    assert system_demo.fmt_poa(1.0, ".2f") == "1.00 "  # exactly 1 is possible: optimal
    assert system_demo.fmt_poa(float("nan"), ".2f") == "nan "  # an empty window is no defect
    assert not system_demo.below_one(1.0 - 1e-12)  # rounding of a product of two 1s
    line = system_demo.status_line(tick(150.0, True))
    assert "poa_hat=  0.84†" in line


@pytest.mark.usefixtures("stubbed")
def test_status_lines_follow_progress_and_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not a terminal (pytest captures): no bar, one status line every 10 simulated seconds.
    out, err = run(tmp_path, capsys)
    lines = err.splitlines()
    ticks = int(sum(p.phase.duration for p in system_demo.PHASES))
    assert len(lines) == ticks // system_demo.STATUS_EVERY_S
    assert lines[0].startswith("t=   10s below")
    assert any("poa_hat=  0.84†" in line for line in lines)  # t = 160, in the spike
    assert "priced priority at saturation" in out
    # --quiet: nothing on stderr, the same result on stdout.
    quiet_out, quiet_err = run(tmp_path, capsys, quiet=True)
    assert quiet_err == "" and quiet_out == out
    # --progress: the bar, with the status as its postfix; --quiet still wins.
    _, bar = run(tmp_path, capsys, progress=True)
    assert "1P/5D simulated s" in bar and "saturated" in bar and "t=   10s" not in bar
    _, nothing = run(tmp_path, capsys, progress=True, quiet=True)
    assert nothing == ""


def test_an_unwritable_folder_fails_before_the_simulation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated although the output folder cannot be written")

    monkeypatch.setattr(system_demo, "calm_baseline_p99", no_work)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="must be a folder that can be written"):
        system_demo.run(blocker / "out")
