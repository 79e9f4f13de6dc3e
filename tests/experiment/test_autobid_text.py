"""The autobid report's regret sentence judges the growth between the longest horizons too: a
whole-range fit averages in the short horizons, where regret has not reached its growth."""

from __future__ import annotations

from typing import Any

from disaggctl.experiment import autobid
from disaggctl.experiment.base import Plan
from disaggctl.experiment.fanout import Job


def _data(regrets: dict[str, list[float]]) -> dict[str, Any]:
    horizons = [100, 400, 1600, 6400]
    jobs, results = [], []
    for spread, values in regrets.items():
        for T, regret in zip(horizons, values, strict=True):
            jobs.append(Job("x:y", {"spread": spread, "T": T, "seed": 0}))
            results.append({key: 0.5 for key in autobid.KEYS} | {"regret": regret,
                            "regret_per_batch": regret / T})  # fmt: skip
    return autobid.analyse(Plan({}, jobs), results)


def test_a_late_steepening_is_named_though_the_whole_fit_stays_under_the_line() -> None:
    # Whole range: slope ≈ 0.55; from 1600 to 6400: log(4)/log(4) = 1.0.
    data = _data({"wide": [10.0, 16.0, 20.0, 80.0]})
    assert data["slopes"]["wide"] < autobid.SLOPE_TARGET < data["tail_slopes"]["wide"]
    text = autobid.describe_regret(data)
    assert "between T = 1600 and 6400" in text
    assert "grows as T^1.00 between its two longest horizons" in text


def test_steady_square_root_growth_reads_as_within_the_line() -> None:
    data = _data({"equal": [10.0, 20.0, 40.0, 80.0]})  # slope ½ everywhere
    text = autobid.describe_regret(data)
    assert "No spread grows faster than T^0.6, over the whole range or between" in text


def test_every_budgeted_user_pacing_is_a_series_of_its_own() -> None:
    jobs, results = [], []
    for pacers, ratio in ((3, 0.99), (12, 0.95)):
        for T in (100, 400):
            jobs.append(Job("x:y", {"spread": "equal", "T": T, "seed": 0, "pacers": pacers}))
            figures = {"welfare_ratio": ratio, "bound_holds": 1.0, "regret": 1.0}
            results.append({key: 0.5 for key in autobid.KEYS} | figures)
    data = autobid.analyse(Plan({}, jobs), results)
    assert set(data["slopes"]) == {"equal", "equal, all 12"}
    text = autobid.describe_welfare(data)
    assert "Every budgeted user pacing against 3 of 12: equal 95.0% against 99.0%" in text


def test_a_run_where_every_user_paces_paces_every_user() -> None:
    res = autobid.run_repeated("wide", 20, 0, pacers=autobid.USERS)
    assert len(res["regret_by_user"]) == len(res["gamma"]) == autobid.USERS
    # User i paces with fraction i mod 3 of its truthful spend: the first three budgets are the
    # 3-of-12 run's, from the same pilot.
    few = autobid.run_repeated("wide", 20, 0, pacers=3)
    assert all(g > 0 for g in res["gamma"]) and res["gamma"][:3] == few["gamma"]
    assert 0 < res["spend_over_budget"] <= 1.0 + 1e-9
