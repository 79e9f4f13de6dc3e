from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from auction import Request, build_radix_tree
from cluster.workloads import TemplateSource, ValueModel, make_workload


@pytest.mark.parametrize(
    ("name", "mean_tokens", "shared"),
    [
        ("mixshare-90", (900, 1300), (0.6, 0.97)),
        ("chains", (1500, 3200), (0.6, 0.97)),
        ("trees-short", (100, 200), (0.6, 0.97)),
        ("trees-long", (3000, 4500), (0.6, 0.97)),
    ],
)
def test_shapes_have_the_lengths_and_sharing_of_the_study(name, mean_tokens, shared) -> None:
    w = make_workload(name, 256, users=16, seed=1)
    assert len(w.requests) == 256 and len(w.clusters) == 256
    mean = w.total_tokens / 256
    assert mean_tokens[0] <= mean <= mean_tokens[1]
    assert shared[0] <= w.shared_fraction <= shared[1]


def test_generators_are_seeded() -> None:
    a, b, c = (make_workload("chains", 64, seed=s) for s in (3, 3, 4))
    assert [r.token_array.tolist() for r in a.requests] == [
        r.token_array.tolist() for r in b.requests
    ]
    assert a.values.tolist() == b.values.tolist() != c.values.tolist()


def test_iid_values_are_pareto_with_tail_index_one_and_a_half() -> None:
    v = make_workload("mixshare-0", 4000, seed=0).values
    assert v.min() >= 1.0
    # P(V > x) = x^-1.5 for the classical Pareto with scale 1.
    assert stats.kstest(v, stats.pareto(b=1.5).cdf).pvalue > 0.01


def test_correlated_values_move_together_within_a_cluster() -> None:
    low = make_workload("chains", 2048, seed=0, values=ValueModel("correlated", 0.0))
    high = make_workload("chains", 2048, seed=0, values=ValueModel("correlated", 0.9))

    def within_cluster_rank_corr(w) -> float:
        v = stats.rankdata(w.values)
        clusters = np.asarray(w.clusters)
        a, b = [], []
        for c in np.unique(clusters):
            idx = np.flatnonzero(clusters == c)
            a.extend(v[idx[:-1]])
            b.extend(v[idx[1:]])
        return float(np.corrcoef(a, b)[0, 1])

    assert abs(within_cluster_rank_corr(low)) < 0.1
    assert within_cluster_rank_corr(high) > 0.7
    assert stats.kstest(high.values, stats.pareto(b=1.5).cdf).pvalue > 0.001


def test_one_bidding_cluster() -> None:
    w = make_workload("trees-short", 200, seed=0, values=ValueModel("one-cluster"))
    clusters = np.asarray(w.clusters)
    bidding = set(clusters[w.values > 0])
    assert len(bidding) == 1 and np.all(w.values[clusters == bidding.pop()] >= 1.0)


def test_template_source_matches_the_calibration_workload() -> None:
    source = TemplateSource(templates=5, template_tokens=64, input_tokens=128, output_tokens=256)
    requests = [source() for _ in range(200)]
    assert all(len(r.tokens) == 128 and r.output_tokens == 256 for r in requests)
    heads = {tuple(r.tokens[:64].tolist()) for r in requests}
    assert len(heads) == 5
    tree = build_radix_tree([Request(r.request_id, "u", r.tokens, 0.0) for r in requests])
    # Five templates branch off the root; every request is its own leaf below one of them.
    assert len(tree.children_of(0)) == 5 and tree.n == 200


@pytest.mark.parametrize(
    "bad",
    [
        lambda: make_workload("nope", 4),
        lambda: make_workload("mixshare-x", 4),
        lambda: make_workload("mixshare-120", 4),
        lambda: make_workload("chains", -1),
        lambda: ValueModel("sorted"),
        lambda: ValueModel("correlated", 1.5),
        lambda: make_workload("chains", 4, users=0),
    ],
)
def test_bad_workload_arguments_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        bad()
