"""Ray tasks and ``--no-ray`` give the same numbers: every job is deterministic in its arguments.

A tiny job of every kind that crosses a process boundary: two closed-loop points (poa), one
``bench.adaptive`` run with its timeline (``bench/`` imported in a Ray worker), one fixed-policy
cell (pareto), one queue through every scheduler (auction) and one repeated auction (autobid).
"""

from __future__ import annotations

import pytest

from disaggctl.experiment import adaptive, auction, autobid, pareto, poa
from disaggctl.experiment.base import Plan
from disaggctl.experiment.fanout import Job, run_jobs
from disaggctl.jsonout import strict_dumps

pytestmark = pytest.mark.integration


def _tiny_poa() -> Plan:
    jobs = [Job("disaggctl.experiment.poa:baseline", {"profile": poa.LLAMA, "topology": "1P/2D"})]
    for seed in (0, 1):
        kw = {
            "profile": poa.LLAMA,
            "topology": "1P/2D",
            "concurrency": 8,
            "seed": seed,
            "warm_s": 2.0,
            "hold_s": 4.0,
            "config": "70B 1P/2D",
        }
        jobs.append(Job("disaggctl.experiment.poa:run_point", kw))
    return Plan({}, jobs)


def test_ray_and_in_process_agree(ray_session: None) -> None:
    plan = _tiny_poa()
    in_process, _ = run_jobs(plan.jobs, use_ray=False, desc="poa", quiet=True)
    on_ray, _ = run_jobs(plan.jobs, use_ray=True, desc="poa", quiet=True)
    assert strict_dumps(poa.analyse(plan, on_ray)) == strict_dumps(poa.analyse(plan, in_process))

    job = Job(
        "disaggctl.experiment.adaptive:run_arm",
        {"case": "resplit-1P/5D", "arm": "static", "seed": 0, "quick": True, "timeline": True},
    )
    (a,), _ = run_jobs([job], use_ray=False, desc="adaptive", quiet=True)
    (b,), _ = run_jobs([job], use_ray=True, desc="adaptive", quiet=True)
    assert a["timeline"] and strict_dumps(a) == strict_dumps(b)
    assert adaptive.TICK_FIELDS[0] in a["timeline"][0]


@pytest.mark.parametrize(
    ("function", "kwargs", "key"),
    [
        (
            "disaggctl.experiment.pareto:run_cell",
            {"concurrency": 16, "view": "stale", "tau": 0.8, "omega": 0.1, "seed": 0,
             "warm_s": 1.0, "hold_s": 2.0},
            pareto.KEYS[0],
        ),
        (
            "disaggctl.experiment.auction:run_queue",
            {"workload": "mixshare-50", "n": 16, "Q": 48, "values": "iid", "rho": 0.0, "seed": 0},
            "dfs-bid",
        ),
        ("disaggctl.experiment.autobid:run_repeated", {"spread": "wide", "T": 8, "seed": 0},
         autobid.KEYS[0]),
    ],
)  # fmt: skip
def test_every_other_kind_of_job_agrees(
    ray_session: None, function: str, kwargs: dict[str, object], key: str
) -> None:
    job = Job(function, kwargs)
    (a,), _ = run_jobs([job], use_ray=False, desc="job", quiet=True)
    (b,), _ = run_jobs([job], use_ray=True, desc="job", quiet=True)
    assert key in a and strict_dumps(a) == strict_dumps(b)
    if function.endswith("run_queue"):
        assert set(a) == set(auction.SCHEDULERS)
