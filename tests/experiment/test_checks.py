"""The referee's checks on a report's tables (disaggctl/experiment/checks.py) and the ratio
of means with its delta-method error (disaggctl/experiment/stats.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disaggctl.experiment.checks import report_problems, same_run_of, tables
from disaggctl.experiment.stats import ratio_of_means

TABLE = """Intro.

| case | arm | TTFT P99 s | req/s | hit | TTFT P99 × |
|---|---|---|---|---|---|
| a | static | 1.0 ± 0.1 | 5.0 ± 0.2 | 0.5 ± 0.01 | 1.00 ± 0 |
| a | adaptive | 1.0 ± 0.1 | 5.0 ± 0.2 | 0.5 ± 0.01 | 1.00 ± 0 |
| a | resplit | 0.9 ± 0.1 | 5.1 ± 0.2 | 0.5 ± 0.01 | 0.9 |

Outro.
"""


def test_a_repeated_run_and_a_bare_ratio_are_named() -> None:
    ((line, header, rows),) = list(tables(TABLE))
    assert line == 3 and header[1] == "arm" and len(rows) == 3
    problems = report_problems(TABLE)
    assert problems == [
        "table at line 3: rows 1 and 2 are one run (a | static | 1.0 ± 0.1 | 5.0 ± 0.2 and "
        "a | adaptive | 1.0 ± 0.1 | 5.0 ± 0.2)",
        "table at line 3, row 3: the ratio in 'TTFT P99 ×' has no error",
    ]


def test_a_run_shown_once_and_thresholds_named_by_a_multiple_pass() -> None:
    fixed = TABLE.replace(
        "| a | adaptive | 1.0 ± 0.1 | 5.0 ± 0.2 | 0.5 ± 0.01 | 1.00 ± 0 |",
        "| a | adaptive | the run of static | the run of static | the run of static | "
        "the run of static |",
    ).replace("| 0.9 |", "| 0.90 ± 0.02 |")
    assert report_problems(fixed) == []
    calm = "| view | θ2 (15×) |\n|---|---|\n| fresh | 1.66 |\n"
    assert report_problems(calm) == []  # a threshold's multiple is no measured ratio


def test_arms_of_a_phase_table_are_compared_whole() -> None:
    phases = (
        "| case | arm | phase | TTFT P99 s | req/s | hit |\n|---|---|---|---|---|---|\n"
        "| a | static | calm | 1 ± 0.1 | 2 ± 0.1 | 3 ± 0.1 |\n"
        "| a | static | hold | 5 ± 0.1 | 2 ± 0.1 | 3 ± 0.1 |\n"
        "| a | adaptive | calm | 1 ± 0.1 | 2 ± 0.1 | 3 ± 0.1 |\n"
        "| a | adaptive | hold | 4 ± 0.1 | 2 ± 0.1 | 3 ± 0.1 |\n"
    )
    assert report_problems(phases) == []  # alike until the controller acts: two runs
    same = phases.replace("| 4 ± 0.1 |", "| 5 ± 0.1 |")
    assert report_problems(same) == [
        "table at line 1: rows 1 and 3 are one run (a | static | calm | 1 ± 0.1 and "
        "a | adaptive | calm | 1 ± 0.1)"
    ]


def test_same_run_of_maps_each_repeat_to_the_first_arm() -> None:
    arms = {
        "static": [{"p99": 1.0, "rps": 2.0}, {"p99": 1.1, "rps": 2.0}],
        "adaptive": [{"p99": 1.0, "rps": 2.0}, {"p99": 1.1, "rps": 2.0}],
        "resplit": [{"p99": 1.0, "rps": 2.0}, {"p99": 1.2, "rps": 2.0}],
    }
    assert same_run_of(arms, ("p99", "rps")) == {"adaptive": "static"}
    assert same_run_of(arms, ("rps",)) == {"adaptive": "static", "resplit": "static"}


finite = st.floats(0.1, 100.0, allow_nan=False, allow_infinity=False)


@given(st.lists(st.tuples(finite, finite), min_size=2, max_size=12))
def test_the_delta_method_error_is_zero_for_proportional_pairs_and_never_negative(
    pairs: list[tuple[float, float]],
) -> None:
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    ratio, se = ratio_of_means(xs, ys)
    assert ratio == pytest.approx(sum(xs) / sum(ys))
    assert se is not None and se >= 0.0 and math.isfinite(se)
    r2, se2 = ratio_of_means([2.5 * y for y in ys], ys)
    assert r2 == pytest.approx(2.5) and se2 is not None and se2 < 1e-6  # cancellation only


def test_the_delta_method_error_matches_a_hand_computation() -> None:
    xs, ys = [1.0, 2.0, 4.0], [2.0, 2.0, 5.0]
    ratio, se = ratio_of_means(xs, ys)
    mx, my = 7 / 3, 3.0
    r = mx / my
    vx = sum((x - mx) ** 2 for x in xs) / 2
    vy = sum((y - my) ** 2 for y in ys) / 2
    cxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / 2
    assert ratio == pytest.approx(r)
    assert se == pytest.approx(math.sqrt(vx - 2 * r * cxy + r * r * vy) / (my * math.sqrt(3)))
    assert ratio_of_means([1.0, None], [2.0, 3.0]) == (0.5, None)  # one pair measured
    assert ratio_of_means([1.0, 2.0], [-1.0, 0.5]) == (None, None)  # ȳ ≤ 0: no ratio
