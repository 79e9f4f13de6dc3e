"""The auction experiment's baseline checks (``disaggctl/experiment/auction_baselines.py``)."""

from __future__ import annotations

from disaggctl.experiment.auction_baselines import (
    arrival_order_welfare,
    baselines,
    common_values,
    describe_baselines,
)
from disaggctl.experiment.stats import mean_se


def test_the_arrival_order_is_worth_nothing_above_a_random_one_on_average() -> None:
    for name in ("mixshare-50", "trees-short"):
        mean, se = mean_se(arrival_order_welfare(name, 64, range(200)))
        assert mean is not None and se is not None and abs(mean) <= 2 * se, (name, mean, se)


def test_the_mixshare_workloads_share_their_values_and_the_others_do_not() -> None:
    assert common_values(["mixshare-10", "mixshare-90", "chains"], 64, [0, 1])
    assert not common_values(["mixshare-50"], 64, [0])  # one alone compares nothing


def test_the_report_names_an_off_baseline_and_a_three_trial_illusion() -> None:
    data = {
        "rows": [
            {"workload": "w1", "seeds": 200, "planned_welfare_pct": -0.9,
             "planned_welfare_pct_se": 0.6, "trials": [-8.4, -6.4, -6.0]},
            {"workload": "w2", "seeds": 200, "planned_welfare_pct": 3.0,
             "planned_welfare_pct_se": 0.5, "trials": [3.0, -9.0, 9.0]},
        ],
        "trial_seeds": [0, 1, 2],
        "common_values": False,
    }  # fmt: skip
    text = describe_baselines(data)
    assert "More than 2 s.e. from 0, against the arrival order's independence" in text
    assert text.count("w2") == 2 and "On w1 the trials' seeds (0, 1, 2) read" in text
    assert "On w2 the trials'" not in text and "mixshare" not in text


def test_the_check_reports_the_trials_own_figures() -> None:
    checked = baselines(["mixshare-50", "mixshare-90"], 32, [0, 1])
    assert checked["common_values"] and checked["trial_seeds"] == [0, 1]
    row = checked["rows"][0]
    assert row["trials"] == arrival_order_welfare("mixshare-50", 32, [0, 1])
    assert row["seeds"] == 200 and row["planned_welfare_pct_se"] > 0
