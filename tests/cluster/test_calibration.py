"""The hardware profiles reproduce their published figures (docs/design.md §6), within each point's
tolerance; figures the model cannot meet are recorded as such with the reason, and the
qualitative shape they describe still holds."""

from __future__ import annotations

import pytest

from cluster.sim.calibration import check, point_value
from cluster.sim.profile import available_profiles, load_profile

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", available_profiles())
def test_profile_reproduces_its_published_figures(name: str) -> None:
    profile = load_profile(name)
    assert profile.calibration, f"{name} has no published figures to check"
    results = check(profile, [p for p in profile.calibration if p.reproduced])
    failures = [
        f"{r.point.topology} {r.point.metric}@C={r.point.concurrency}: "
        f"simulated {r.simulated:.4g}, published {r.published} ± {r.point.tolerance:.0%}"
        for r in results
        if not r.ok
    ]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    ("name", "topology"),
    [
        ("b200-llama70b-fp8-tp4", "1P/2D"),
        ("b200-llama70b-fp8-tp4", "1P/5D"),
        ("b200-nemotron340b-fp8-tp8", "1P/2D"),
    ],
)
def test_saturation_is_prefill_bound(name: str, topology: str) -> None:
    """Past the knee TTFT explodes while ITL does not move."""
    profile = load_profile(name)

    def figure(c: int, metric: str) -> float:
        return point_value(profile, topology, c, metric)

    assert figure(128, "ttft_p99_s") >= 2.5 * figure(96, "ttft_p99_s")
    assert figure(512, "ttft_p99_s") >= 5 * figure(128, "ttft_p99_s")
    assert figure(512, "itl_p99_s") == pytest.approx(figure(96, "itl_p99_s"), rel=0.05)
