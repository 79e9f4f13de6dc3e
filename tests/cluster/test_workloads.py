from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from scipy import stats

from auction import Request, build_radix_tree
from cluster.sim.template_source import TemplateSource
from cluster.sim.workloads import OUTPUT_TOKENS, ValueModel, make_workload

# The shapes of docs/design.md §8 at the experiment's queue size (Q = 1024, seed 0), measured:
#   workload      shared  mean prompt  distinct tokens
#   mixshare-50   88.0%       566          69.5k   (4 ~1k articles + 1024 questions of ~64)
#   mixshare-90   93.0%       968          69.5k
#   chains        88.0%      3062         377k     (~3k tokens, each step extends the last)
#   trees-short   87.7%       154          19.5k   (fits the 23k-token cache of h100-32b)
#   trees-long    90.8%      3854         364k     (does not)
# Targets: sharing within the study's 60-97%; the lengths of the shapes; short trees' distinct
# tokens below the cache and long trees' far above it.
H100_32B_CACHE_TOKENS = 23_000
SHAPES = [
    # name, mean prompt tokens (lo, hi), shared (lo, hi), distinct tokens (lo, hi)
    ("mixshare-50", (500, 650), (0.80, 0.92), (60_000, 80_000)),
    ("mixshare-90", (900, 1050), (0.90, 0.97), (60_000, 80_000)),
    ("chains", (2800, 3300), (0.80, 0.92), (300_000, 450_000)),
    ("trees-short", (140, 170), (0.80, 0.92), (15_000, 0.9 * H100_32B_CACHE_TOKENS)),
    ("trees-long", (3600, 4200), (0.85, 0.95), (10 * H100_32B_CACHE_TOKENS, 450_000)),
]


@pytest.mark.parametrize(("name", "mean_tokens", "shared", "distinct"), SHAPES)
def test_default_workloads_have_the_shapes_of_the_study(
    name, mean_tokens, shared, distinct
) -> None:
    w = make_workload(name, 1024, seed=0)
    assert len(w.requests) == 1024 and len(w.clusters) == 1024
    assert 0.6 <= w.shared_fraction <= 0.97  # the study's range
    assert shared[0] <= w.shared_fraction <= shared[1]
    assert mean_tokens[0] <= w.mean_prompt_tokens <= mean_tokens[1]
    assert distinct[0] <= w.distinct_tokens <= distinct[1]
    assert w.output_tokens == OUTPUT_TOKENS and w.knobs["n"] == 1024


def test_mixshare_sweep_spans_the_study_sharing() -> None:
    sharing = [make_workload(f"mixshare-{p}", 1024, seed=0).shared_fraction for p in (25, 75)]
    assert 0.6 <= sharing[0] < sharing[1] <= 0.97


def test_every_knob_is_a_parameter_and_recorded() -> None:
    w = make_workload("chains", 40, seed=0, steps=4, system_tokens=10, task_tokens=20,
                      step_tokens=5, output_tokens=3)  # fmt: skip
    assert w.knobs == {"steps": 4, "system_tokens": 10, "task_tokens": 20, "step_tokens": 5,
                       "n": 40, "users": 128, "output_tokens": 3, "values": "iid"}  # fmt: skip
    # Every step extends the last: 10 trajectories of 4 prompts, each a prefix of the next.
    clusters = np.asarray(w.clusters)
    assert len(set(w.clusters)) == 10
    first = [r.token_array for r, c in zip(w.requests, clusters, strict=True) if c == 0]
    for a, b in itertools.pairwise(first):
        assert len(b) > len(a) and b[: len(a)].tolist() == a.tolist()
    assert all(r.output_tokens == 3 for r in w.sim_requests())
    t = make_workload("trees-short", 13, seed=0, branching=2, depth=2, question_tokens=8,
                      thought_tokens=4)  # fmt: skip
    assert t.knobs["branching"] == 2 and t.knobs["question_tokens"] == 8
    assert sorted(collections.Counter(t.clusters).values()) == [1, 6, 6]  # 2 + 4 per problem
    s = make_workload("mixshare-100", 30, seed=0, articles=3, prefix_tokens=50, question_tokens=5)
    tree = build_radix_tree(s.requests)
    assert len(tree.children_of(0)) == 3 and s.knobs["articles"] == 3
    with pytest.raises(ValueError, match="depthh"):
        make_workload("trees-long", 4, depthh=2)
    with pytest.raises(ValueError, match="step_tokens must be >= 1"):
        make_workload("chains", 4, step_tokens=0)


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


def test_perfect_correlation_gives_one_finite_value_per_cluster() -> None:
    w = make_workload("trees-long", 390, seed=0, values=ValueModel("correlated", 1.0))
    clusters = np.asarray(w.clusters)
    assert np.all(np.isfinite(w.values)) and w.values.min() >= 1.0
    for c in np.unique(clusters):
        assert np.ptp(w.values[clusters == c]) == pytest.approx(0.0, abs=1e-9)
    assert ValueModel("correlated", 0.5).label == "correlated(rho=0.5)"
    assert ValueModel().label == "iid"


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


def test_output_lengths_spread_around_the_mean_and_leave_the_rest_as_it_was() -> None:
    """``output_range_ratio`` draws each output uniformly from [L(1 - r), L(1 + r)] and draws
    nothing at r = 0: prompts, users and bids are the same requests either way."""
    shape = {"templates": 5, "template_tokens": 64, "input_tokens": 128, "output_tokens": 256}
    fixed = TemplateSource(**shape, seed=3, bidders={"gold": 0.3})
    spread = TemplateSource(**shape, seed=3, bidders={"gold": 0.3}, output_range_ratio=0.5)
    a, b = [fixed() for _ in range(2000)], [spread() for _ in range(2000)]
    assert {r.output_tokens for r in a} == {256}
    lengths = np.array([r.output_tokens for r in b])
    assert lengths.min() >= 128 and lengths.max() <= 384
    assert lengths.min() < 140 and lengths.max() > 372  # the whole range is drawn
    assert abs(lengths.mean() - 256) < 4 * lengths.std() / np.sqrt(len(lengths))
    for x, y in zip(a, b, strict=True):
        assert (x.tokens == y.tokens).all() and (x.user, x.bid) == (y.user, y.bid)
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match="output_range_ratio"):
            TemplateSource(**shape, output_range_ratio=bad)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: make_workload("nope", 4),
        lambda: make_workload("mixshare-x", 4),
        lambda: make_workload("mixshare-120", 4),
        lambda: make_workload("chains", -1),
        lambda: ValueModel("sorted"),
        lambda: ValueModel("correlated", 1.5),
        lambda: ValueModel("iid", 0.5),  # ρ belongs to the correlated model only
        lambda: make_workload("chains", 4, users=0),
    ],
)
def test_bad_workload_arguments_are_refused(bad) -> None:
    with pytest.raises(ValueError):
        bad()
